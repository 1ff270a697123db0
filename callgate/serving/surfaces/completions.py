"""The completions service: one validated `CompletionRequest` -> a `text_completion` or its
SSE stream, straight on the Engine protocol.

Knows: the order of work — the token ids checked against the vocabulary (400), admission
(429, the chat service's own `Admission`, so both routes share the server's capacity), the
prompt tokenised as written off the event loop (special-token text is the special token:
the client wrote the whole prompt, chat template included, as BFCL's self-hosted handlers
and vLLM's benchmark clients do; nothing is added, not even BOS) and bounded by the context
(400 `context_length_exceeded`), generation, the answer — and the metrics it reports.
Does not know: HTTP, pydantic, templates, grammars, parsers or validators (no tools here).

Leaving early (client gone, task cancelled) closes the engine stream and aborts the request,
shielded from cancellation, so its batch slot is always freed.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any, Protocol

import anyio

from callgate.errors import CallgateError, EngineError, InvalidRequestError
from callgate.serving.engines.engine import Engine, GenerationRequest, SamplingParams, TokenDelta, Tokenizer
from callgate.serving.metrics import Metrics
from callgate.serving.settings import Settings
from callgate.serving.surfaces import sse
from callgate.serving.surfaces.protocol_completions import CompletionRequest, text_completion_dict
from callgate.serving.surfaces.protocol_request import check_token_ids
from callgate.serving.surfaces.protocol_response import usage_dict

log = logging.getLogger("callgate.completions")


class Slots(Protocol):
    """The server's admission control (chat.Admission): acquire raises 429 when full."""

    def acquire(self) -> None: ...
    def release(self) -> None: ...


@dataclass(frozen=True, slots=True)
class _Prompt:
    text: str
    ids: tuple[int, ...]
    max_tokens: int


class CompletionJob:
    """One admitted completion; `close` frees its slot (idempotent)."""

    def __init__(self, slots: Slots, req: CompletionRequest, prompt: _Prompt, started_s: float) -> None:
        self.req = req
        self.prompt = prompt
        self.completion_id = "cmpl-" + secrets.token_hex(12)
        self.created = int(time.time())
        self.started_s = started_s
        self.finish_reason = "stop"
        self.usage: dict[str, Any] = usage_dict(len(prompt.ids), 0)
        self._slots = slots
        self._closed = False

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._slots.release()


class CompletionService:
    """Runs completions against one engine, within the server's admission limits."""

    def __init__(self, settings: Settings, engine: Engine, slots: Slots, metrics: Metrics) -> None:
        self.settings = settings
        self.engine = engine
        self.slots = slots
        self.metrics = metrics

    async def start(self, req: CompletionRequest) -> CompletionJob:
        """Check, admit and tokenise; the caller must `close()` the job (the response
        functions do it themselves). Raises InvalidRequestError / RateLimitError."""
        vocab_size = self.engine.tokenizer.vocab_size
        check_token_ids(req.prompt_ids or (), vocab_size, "prompt")
        check_token_ids(req.logit_bias or (), vocab_size, "logit_bias")
        self.slots.acquire()
        started_s = time.monotonic()
        try:
            prompt = await anyio.to_thread.run_sync(  # tokenising is CPU work: off the event loop
                _bounded_prompt,
                req,
                self.engine.tokenizer,
                self.engine.max_model_len,
                self.settings.limits.default_max_tokens,
            )
            return CompletionJob(self.slots, req, prompt, started_s)
        except BaseException:
            self.slots.release()
            raise

    async def complete(self, job: CompletionJob) -> dict[str, Any]:
        """The non-streaming `text_completion`. Raises CallgateError."""
        try:
            parts: list[str] = []
            async with contextlib.aclosing(self._generate(job)) as deltas:
                async for delta in deltas:
                    parts.append(delta.text)
            return text_completion_dict(
                completion_id=job.completion_id,
                created=job.created,
                model=self.settings.model_name,
                text="".join(parts),
                finish_reason=job.finish_reason,
                usage=job.usage,
            )
        finally:
            job.close()

    async def stream(self, job: CompletionJob) -> AsyncGenerator[bytes, None]:
        """SSE bytes: a chunk per generated text, a last chunk with the finish reason, the
        usage chunk when asked for, `[DONE]`; an error becomes a terminal `error` event.
        Closing the generator early aborts the generation."""
        try:
            async with contextlib.aclosing(self._generate(job)) as deltas:
                async for delta in deltas:
                    if delta.text:
                        yield sse.data_event(self._chunk(job, delta.text, None))
            yield sse.data_event(self._chunk(job, "", job.finish_reason))
            if job.req.include_usage:
                yield sse.data_event(self._chunk(job, None, None, usage=job.usage))
        except CallgateError as exc:
            yield sse.error_event(exc.to_body())
        except Exception:  # headers are sent: the client still gets an error event and [DONE]
            log.exception("stream %s failed", job.completion_id)
            yield sse.error_event(CallgateError("internal server error", code="internal_error").to_body())
        finally:
            job.close()
        yield sse.DONE

    def _chunk(
        self, job: CompletionJob, text: str | None, finish: str | None, usage: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        return text_completion_dict(
            completion_id=job.completion_id,
            created=job.created,
            model=self.settings.model_name,
            text=text,
            finish_reason=finish,
            usage=usage,
        )

    async def _generate(self, job: CompletionJob) -> AsyncGenerator[TokenDelta, None]:
        """The engine's deltas; sets the job's finish reason and usage, reports metrics."""
        req, prompt = job.req, job.prompt
        sampling = SamplingParams(
            prompt.max_tokens,
            req.temperature,
            req.top_p,
            req.seed,
            req.stop,
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            repetition_penalty=req.repetition_penalty,
            top_k=req.top_k,
            min_p=req.min_p,
            logit_bias=req.logit_bias,
            ignore_eos=req.ignore_eos,
        )
        generation = GenerationRequest(job.completion_id, prompt.text, sampling, prompt_ids=prompt.ids)
        stream = self.engine.generate(generation)
        finished = False
        last_s = job.started_s
        prompt_tokens = completion_tokens = 0
        try:
            async for delta in stream:
                now_s = time.monotonic()
                if last_s == job.started_s:
                    self.metrics.first_token(now_s - last_s)
                else:
                    self.metrics.inter_token(now_s - last_s)
                last_s = now_s
                prompt_tokens, completion_tokens = delta.prompt_tokens, delta.completion_tokens
                job.usage = usage_dict(prompt_tokens, completion_tokens, delta.cached_tokens)
                if delta.finish_reason is not None:
                    finished = True
                    if delta.finish_reason == "abort":  # the engine stopped it (shutting down)
                        raise EngineError("the engine aborted the generation", code="generation_aborted")
                    job.finish_reason = "length" if delta.finish_reason == "length" else "stop"
                yield delta
        finally:
            self.metrics.tokens(prompt_tokens, completion_tokens)
            with anyio.CancelScope(shield=True):
                await stream.aclose()
                if not finished:
                    await self.engine.abort(job.completion_id)


def _bounded_prompt(req: CompletionRequest, tokenizer: Tokenizer, context_tokens: int, default_max: int) -> _Prompt:
    """The prompt's text and ids with its max_tokens; 400 when it cannot fit the context. A
    text too long to fit by its length alone is refused before it is tokenised."""
    if req.prompt is not None:
        at_least = tokenizer.min_tokens(req.prompt)
        if at_least >= context_tokens:
            raise _too_long(f"the prompt is at least {at_least} tokens", context_tokens)
        ids = tuple(tokenizer.encode(req.prompt))
        if not ids:
            raise InvalidRequestError("prompt: holds no token (only characters the tokenizer drops)", param="prompt")
    else:
        assert req.prompt_ids is not None
        ids = req.prompt_ids
    if len(ids) >= context_tokens:
        raise _too_long(f"the prompt is {len(ids)} tokens", context_tokens)
    if req.max_tokens is not None and len(ids) + req.max_tokens > context_tokens:
        raise InvalidRequestError(
            f"max_tokens: {req.max_tokens} + a {len(ids)}-token prompt exceed the model's context of "
            f"{context_tokens} tokens",
            param="max_tokens",
            code="context_length_exceeded",
        )
    text = req.prompt if req.prompt is not None else tokenizer.decode(list(ids))
    return _Prompt(text, ids, req.max_tokens or min(default_max, context_tokens - len(ids)))


def _too_long(what: str, context_tokens: int) -> InvalidRequestError:
    return InvalidRequestError(
        f"prompt: {what}; the model's context is {context_tokens} tokens",
        param="prompt",
        code="context_length_exceeded",
    )
