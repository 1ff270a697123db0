"""A scripted engine for hermetic tests: the `Engine` protocol without a model.

Knows: how to stream scripted replies as token deltas with vLLM's semantics — stop
strings cut and excluded, `max_tokens` ends with "length", `abort(id)` ends the stream
with a last delta whose finish reason is "abort", a consumer that closes the stream (or
is cancelled) frees the slot, cumulative token counts (EOS counted), a simulated prefix
cache (whole 16-token blocks of the longest prompt prefix seen before).
Does not know: any model, vllm, torch, HTTP. Sampling parameters other than `max_tokens`
and `stop` (temperature, penalties, top_k, min_p, logit_bias) are recorded, not simulated:
the scripted reply is the output whatever they say.

Scripts: each reply is a `str` (streamed one character per token), a sequence of strings
(one delta per element — to choose the split), or a `FakeReply` (chunks plus a finish
reason, a per-token delay, or an exception to raise mid-stream). Replies are taken in
order from `replies`; once they run out `respond(request)` is asked, if given.
The fake counts one token per delta; a delta's `token_ids` are `FakeTokenizer` ids.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field

from callgate.errors import EngineError
from callgate.serving.engines.engine import GenerationRequest, SamplingParams, TokenDelta

PREFIX_BLOCK_TOKENS = 16  # cached prefixes are whole blocks, as in vLLM


class FakeTokenizer:
    """Byte-level: ids 0..255 are bytes, then the special tokens (the first is EOS)."""

    def __init__(self, specials: Sequence[str] = ("<|im_end|>", "<|im_start|>", "<|endoftext|>")) -> None:
        self.specials = tuple(specials)
        self._special_ids = {s: 256 + i for i, s in enumerate(self.specials)}

    @property
    def eos_token_id(self) -> int:
        return 256

    @property
    def vocab_size(self) -> int:
        return 256 + len(self.specials)

    def encode(self, text: str, untrusted_spans: tuple[tuple[int, int], ...] = ()) -> list[int]:
        ids: list[int] = []
        pos = 0
        for start, end in sorted(untrusted_spans):
            ids += self._encode_trusted(text[pos:start])
            ids += list(text[start:end].encode("utf-8"))
            pos = max(pos, end)
        return ids + self._encode_trusted(text[pos:])

    def _encode_trusted(self, text: str) -> list[int]:
        ids: list[int] = []
        i = 0
        while i < len(text):
            special = next((s for s in self.specials if text.startswith(s, i)), None)
            if special is not None:
                ids.append(self._special_ids[special])
                i += len(special)
            else:
                ids += list(text[i].encode("utf-8"))
                i += 1
        return ids

    def min_tokens(self, text: str) -> int:
        """Every token is one byte or a special token's text."""
        longest = max([1, *(len(s.encode("utf-8")) for s in self.specials)])
        return -(-len(text.encode("utf-8", "surrogatepass")) // longest)

    def decode(self, ids: list[int]) -> str:
        out = bytearray()
        for i in ids:
            out += bytes([i]) if i < 256 else self.specials[i - 256].encode("utf-8")
        return out.decode("utf-8", errors="replace")

    def vocabulary(self) -> dict[bytes, list[int]]:
        return {bytes([b]): [b] for b in range(256)}


@dataclass(frozen=True, slots=True)
class FakeReply:
    """One scripted generation: `chunks` streamed in order, one token each."""

    chunks: tuple[str, ...]
    finish_reason: str = "stop"
    token_delay_s: float = 0.0
    error: Exception | None = None  # raised after the chunks (an engine failure)

    @staticmethod
    def of(script: str | Sequence[str] | FakeReply) -> FakeReply:
        if isinstance(script, FakeReply):
            return script
        if isinstance(script, str):
            return FakeReply(tuple(script))
        return FakeReply(tuple(script))


Script = str | Sequence[str] | FakeReply


@dataclass(slots=True)
class _Stream:
    """Stop-string handling for one request: emits text that cannot start a stop string."""

    stop: tuple[str, ...]
    text: str = ""
    emitted: int = 0
    stopped: bool = False
    matched: str | None = None  # the stop string that ended the output

    def push(self, chunk: str) -> str:
        self.text += chunk
        hits = [(i, s) for s in self.stop if s and (i := self.text.find(s)) >= 0]
        if hits:
            hit, self.matched = min(hits)
            self.stopped = True
            return self._emit_to(hit)
        return self._emit_to(len(self.text) - self._held_back())

    def flush(self) -> str:
        return "" if self.stopped else self._emit_to(len(self.text))

    def _held_back(self) -> int:
        longest = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(self.text)), longest, -1):
                if self.text.endswith(s[:k]):
                    longest = k
                    break
        return longest

    def _emit_to(self, end: int) -> str:
        out = self.text[self.emitted : max(end, self.emitted)]
        self.emitted = max(end, self.emitted)
        return out


@dataclass
class FakeEngine:
    """Scripted `Engine`. Inspect `requests` (every request received, in order), `sampling`
    (their sampling parameters) and `aborted` (request ids ended early by `abort` or by the
    consumer closing the stream)."""

    replies: Iterable[Script] = ()
    respond: Callable[[GenerationRequest], Script] | None = None
    model_name: str = "fake-model"
    max_model_len: int = 4096
    token_delay_s: float = 0.0
    tokenizer: FakeTokenizer = field(default_factory=FakeTokenizer)
    requests: list[GenerationRequest] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._script = iter(self.replies)
        self._running: dict[str, asyncio.Event] = {}
        self._seen_prompts: list[list[int]] = []
        self.closed = False

    @property
    def sampling(self) -> list[SamplingParams]:
        """The sampling parameters of every request received, in order."""
        return [r.sampling for r in self.requests]

    def num_running(self) -> int:
        return len(self._running)

    async def abort(self, request_id: str) -> None:
        event = self._running.get(request_id)
        if event is not None and not event.is_set():
            event.set()
            self.aborted.append(request_id)

    async def shutdown(self) -> None:
        for event in self._running.values():
            event.set()
        self.closed = True

    async def generate(self, req: GenerationRequest) -> AsyncGenerator[TokenDelta, None]:
        if self.closed:
            raise EngineError("engine is shut down")
        if req.request_id in self._running:
            raise EngineError(f"request id {req.request_id!r} is already running")
        self.requests.append(req)
        reply = FakeReply.of(self._next_script(req))
        prompt_ids = (
            list(req.prompt_ids)
            if req.prompt_ids is not None
            else self.tokenizer.encode(req.prompt, req.untrusted_spans)
        )
        cached = self._cached_prefix(prompt_ids)
        aborted = self._running[req.request_id] = asyncio.Event()
        finished = False
        try:
            async for delta in self._deltas(req, reply, len(prompt_ids), cached, aborted):
                finished = delta.finish_reason is not None
                yield delta
        finally:
            del self._running[req.request_id]
            if not finished and not aborted.is_set():
                self.aborted.append(req.request_id)

    def _next_script(self, req: GenerationRequest) -> Script:
        script = next(self._script, None)
        if script is not None:
            return script
        if self.respond is None:
            raise EngineError("FakeEngine has no scripted reply left")
        return self.respond(req)

    def _cached_prefix(self, prompt_ids: list[int]) -> int:
        best = 0
        for seen in self._seen_prompts:
            n = 0
            for a, b in zip(seen, prompt_ids, strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        self._seen_prompts.append(prompt_ids)
        # vLLM never serves the whole prompt from cache: the last token is always recomputed.
        return min(best, len(prompt_ids) - 1) // PREFIX_BLOCK_TOKENS * PREFIX_BLOCK_TOKENS

    async def _deltas(
        self, req: GenerationRequest, reply: FakeReply, n_prompt: int, cached: int, aborted: asyncio.Event
    ) -> AsyncIterator[TokenDelta]:
        stream = _Stream(req.sampling.stop)
        delay_s = reply.token_delay_s or self.token_delay_s
        n = 0
        for chunk in reply.chunks:
            await asyncio.sleep(delay_s)
            if aborted.is_set():
                yield TokenDelta("", (), "abort", n_prompt, n, cached)
                return
            n += 1
            text = stream.push(chunk)
            ids = tuple(self.tokenizer.encode(chunk, ((0, len(chunk)),)))
            finish = "stop" if stream.stopped else ("length" if n >= req.sampling.max_tokens else None)
            if finish is not None:
                tail = "" if stream.stopped else stream.flush()
                yield TokenDelta(text + tail, ids, finish, n_prompt, n, cached, stream.matched)
                return
            yield TokenDelta(text, ids, None, n_prompt, n, cached)
        if reply.error is not None:
            raise reply.error
        eos = (self.tokenizer.eos_token_id,) if reply.finish_reason == "stop" else ()
        yield TokenDelta(stream.flush(), eos, reply.finish_reason, n_prompt, n + len(eos), cached)
