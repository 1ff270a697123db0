"""Quick-instruction heads run: short side tasks as continuations of a conversation's prompt.

Knows: how heads run concurrently (beside a main generation or on their own), when each
starts, deciding a categorical head early, read_url per URL, and what a run reports. What a
head is (task, placement, prompt, grammar, bound, decoding) lives in `quick_heads.py`.
Does not know: HTTP, pydantic, vllm, or any format's syntax.

KV reuse is the engine's business: with prefix caching on, a head's prompt shares every
full cache block of the conversation with the main prompt, so it pays only for its suffix
(the conversation's partial last block plus the instruction: `--block-size` sets the block).
Each head reports `cached_tokens / prompt_tokens` as its prefix-cache hit rate.

Deciding early (constrained heads, `QuickConfig.decide_early`): a categorical head's answer
is fixed as soon as the text written so far is a prefix of one admitted label spelling
only; from there the grammar forces the rest, so greedy decoding would write exactly that
spelling. The head stops reading once the answer is decided (closing the stream aborts it
in the engine) and completes the label itself: the same answer as the full greedy
constrained decode. It asks for max_tokens = `Choice.deciding_bytes()` (every token writes
at least one byte, so the answer is decided by then) with the constraint processor's
budget closing off for that request: budget closing narrows a row's mask to what still fits
in its max_tokens, which can change the label greedy decoding picks, while the grammar's
mask alone is the one the full decode sees in its first steps. Labels where one spelling is
a prefix of another (only EOS decides) keep the full decode's request.

`read_url` decides the URLs one after another, one request each: the head prompt, the lines
answered so far, the forced line start "URL:", then " yes" or " no" under a grammar with
max_tokens=2, decided the same way. Each answer is conditioned on the lines before it, as
in the full decode (used with `decide_early=False` or unconstrained); each URL costs one
step, and its prompt shares the KV blocks of the request before it. The forced text is
tokenized as written, where the constrained full decode picks its own tokens for it, so the
two can still differ in rare cases.

A title's line end: `title` ends at the end of its first line with text (some models start
the answer with a newline, so an engine stop string "\n" would end it before any text). The
head sends no stop string and stops reading once `first_line` finds the line's end, which
aborts it in the engine, as vLLM's own stop strings do; one request writes the tokens a
greedy decode without any stop writes.

`HeadRun.text` is the answer as written in full (a decided label completed, each read_url
line with its forced start, a title up to its line's end, the blank lines before it kept);
`token_ids` are only the tokens the model generated (those read: a title's may run a token
past its line's end where the engine delivered two at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from callgate.serving.engines.engine import Engine, GenerationRequest, SamplingParams, TokenDelta
from callgate.serving.quick.heads import (
    DEFAULT_LABELS,
    HEADS,
    URL_CHOICE,
    HeadConstraint,
    HeadPrompt,
    check_tasks,
    decode,
    first_line,
    head_choice,
    head_constraint,
    head_max_tokens,
    head_prompt,
    head_regex,
    urls_in,
)


@dataclass(frozen=True, slots=True)
class QuickConfig:
    """Server-wide head settings: label sets of the categorical heads, constrained or not, and
    whether constrained categorical heads stop once their answer is decided (module docstring)."""

    labels: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: DEFAULT_LABELS)
    constrained: bool = True
    decide_early: bool = True


# ---- running ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HeadRun:
    """What one head produced."""

    task: str
    output: Any
    text: str
    token_ids: tuple[int, ...]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish_reason: str

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass(frozen=True, slots=True)
class QuickResult:
    """All heads of one request, in the order asked."""

    runs: tuple[HeadRun, ...]

    def results(self) -> dict[str, Any]:
        return {r.task: r.output for r in self.runs}

    def prefix_cache(self) -> dict[str, float]:
        return {r.task: round(r.hit_rate, 4) for r in self.runs}

    def usage(self) -> dict[str, Any]:
        prompt = sum(r.prompt_tokens for r in self.runs)
        completion = sum(r.completion_tokens for r in self.runs)
        cached = sum(r.cached_tokens for r in self.runs)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }


@dataclass(frozen=True, slots=True)
class Conversation:
    """What every head of a request renders: messages, tools, reasoning switches."""

    messages: tuple[Mapping[str, Any], ...]
    tools: tuple[Mapping[str, Any], ...] | None = None
    thinking: bool = False
    reasoning_effort: str | None = None


class QuickService:
    """Runs heads against one engine, in one format."""

    def __init__(self, engine: Engine, fmt: str, config: QuickConfig | None = None) -> None:
        self.engine = engine
        self.format = fmt
        self.config = config or QuickConfig()
        self._vocabulary: Any = None

    async def run(
        self,
        conversation: Conversation,
        tasks: Sequence[str],
        *,
        request_id: str | None = None,
        labels: Mapping[str, tuple[str, ...]] | None = None,
    ) -> QuickResult:
        """Every head in `tasks` on `conversation`, concurrently. Raises 400 errors."""
        rid = request_id or "quick-" + secrets.token_hex(8)
        names = check_tasks(self.format, tasks)
        runs = await asyncio.gather(*(self.run_head(conversation, t, f"{rid}-{t}", labels) for t in names))
        return QuickResult(tuple(runs))

    async def run_head(
        self,
        conversation: Conversation,
        task: str,
        request_id: str,
        labels: Mapping[str, tuple[str, ...]] | None = None,
    ) -> HeadRun:
        """One head: render, constrain, generate greedily, decode."""
        label_sets = {**self.config.labels, **(labels or {})}
        urls = urls_in(conversation.messages)
        spec = HEADS[task]
        if spec.output == "urls" and not urls:
            return HeadRun(task, {}, "", (), 0, 0, 0, "stop")  # nothing to decide: no generation
        prompt = head_prompt(
            self.format,
            conversation.messages,
            task,
            tools=conversation.tools,
            thinking=conversation.thinking,
            reasoning_effort=conversation.reasoning_effort,
        )
        early = self.config.constrained and self.config.decide_early
        if spec.output == "urls" and early:
            return await self._read_urls(prompt, urls, request_id)
        choice = head_choice(task, label_sets) if early and spec.output == "choice" else None
        regex = head_regex(task, label_sets, urls)
        constraint = await self._constraint(regex) if regex is not None else None
        max_tokens = head_max_tokens(task, urls)
        deciding = choice.deciding_bytes() if choice is not None and constraint is not None else None
        if constraint is not None and deciding is not None and deciding < max_tokens:
            # the engine stops at the deciding tokens; budget closing off keeps their mask the full decode's
            constraint = dataclasses.replace(constraint, budget_closing=False)
            max_tokens = deciding
        sampling = SamplingParams(max_tokens, 0.0)  # no engine stop strings: a line's end is read here
        req = GenerationRequest(request_id, prompt.text, sampling, constraint, prompt.spans)
        line = functools.partial(first_line, ends=spec.stop) if spec.stop else None
        last = await _generate(self.engine, req, choice.decided if choice is not None else line)
        cut = line(last.text) if line is not None else None
        if cut is not None:  # ended at its line's end, also where the bound fell on it
            last = dataclasses.replace(last, text=cut, finish_reason="stop")
        said = choice.decided(last.text, last.finish_reason == "stop") if choice is not None else None
        text, output = (said[0], said[1]) if said else (last.text, decode(task, last.text, label_sets, urls))
        return last.run(task, output, text)

    async def _read_urls(self, prompt: HeadPrompt, urls: Sequence[str], request_id: str) -> HeadRun:
        """read_url decided URL by URL, each after the lines before it: the head prompt, the
        answers so far, the forced "URL:", then " yes" or " no" (module docstring). The URLs
        are content: special-token text stays text."""
        constraint = await self._constraint(" (?:yes|no)")
        # " y" / " n" decide, so two tokens always do; with max_tokens=2 the processor's budget
        # closing lets only a whole " yes" / " no" token start (one step), not a lone " ".
        sampling = SamplingParams(2, 0.0)
        text, spans = prompt.text, prompt.spans
        lasts: list[_Last] = []
        said: list[tuple[str, str] | None] = []
        for i, u in enumerate(urls):
            spans = (*spans, (len(text), len(text) + len(u)))
            text = f"{text}{u}:"
            req = GenerationRequest(f"{request_id}-{i}", text, sampling, constraint, spans)
            lasts.append(await _generate(self.engine, req, URL_CHOICE.decided))
            said.append(URL_CHOICE.decided(lasts[-1].text, lasts[-1].finish_reason == "stop"))
            if said[-1] is None:
                break  # the grammar ends here (only an abort): no line to continue from
            text += said[-1][0] + "\n"
        output = None if None in said else {u: d[1] == "yes" for u, d in zip(urls, said, strict=True) if d}
        lines = (f"{u}:{d[0] if d else x.text}" for u, d, x in zip(urls, said, lasts, strict=False))
        return _Last.merged(lasts).run("read_url", output, "\n".join(lines))

    async def _constraint(self, regex: str) -> HeadConstraint | None:
        """The regex's ref, its grammar checked (None: unconstrained)."""
        if not self.config.constrained:
            return None
        from callgate.constraints.llg import check

        ref = head_constraint(regex)
        await anyio.to_thread.run_sync(check, ref.grammar, None, None)
        return ref

    def beside(self, conversation: Conversation, tasks: Sequence[str], request_id: str) -> QuickBeside:
        """Heads to run beside a main generation (tasks checked now, nothing started); see QuickBeside."""
        return QuickBeside(self, conversation, check_tasks(self.format, tasks, param="callgate.quick"), request_id)


@dataclass(slots=True)
class QuickBeside:
    """Heads beside a chat completion. `launch()` starts the user-position heads: call it once
    the main generation's first token is out, because only then is the whole conversation's
    KV in the prefix cache (a long prompt is prefilled and cached chunk by chunk, and a head
    scheduled between two chunks would compute the rest of the conversation again).
    `finish(answer)` launches them if that never happened, runs the answer-position heads on
    the conversation plus the answer and returns every result; `cancel()` stops whatever
    still runs (the chat failed or the client left)."""

    service: QuickService
    conversation: Conversation
    tasks: tuple[str, ...]
    request_id: str
    early: dict[str, asyncio.Future[HeadRun]] = field(default_factory=dict)
    launched: bool = False

    def launch(self) -> None:
        if self.launched:
            return
        self.launched = True
        for t in self.tasks:
            if HEADS[t].position == "user":
                self.early[t] = asyncio.ensure_future(
                    self.service.run_head(self.conversation, t, f"{self.request_id}-q-{t}")
                )

    async def finish(self, answer: Mapping[str, Any] | None) -> QuickResult:
        self.launch()
        after = self.conversation
        if answer is not None:
            after = Conversation((*after.messages, answer), after.tools, after.thinking, after.reasoning_effort)
        late = {
            t: asyncio.ensure_future(self.service.run_head(after, t, f"{self.request_id}-q-{t}"))
            for t in self.tasks
            if t not in self.early
        }
        try:
            runs = {t: await f for t, f in {**self.early, **late}.items()}
        finally:
            for f in late.values():
                f.cancel()
        return QuickResult(tuple(runs[t] for t in self.tasks))

    def cancel(self) -> None:
        for f in self.early.values():
            if f.done() and not f.cancelled():
                f.exception()  # retrieved: a failed head whose result nobody wants is not logged
            f.cancel()


@dataclass(frozen=True, slots=True)
class _Last:
    text: str
    token_ids: tuple[int, ...]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish_reason: str | None

    def run(self, task: str, output: Any, text: str) -> HeadRun:
        finish = self.finish_reason or "stop"
        return HeadRun(
            task, output, text, self.token_ids, self.prompt_tokens, self.completion_tokens, self.cached_tokens, finish
        )

    @staticmethod
    def merged(lasts: Sequence[_Last]) -> _Last:
        """Several requests of one head as one: tokens concatenated, counts summed."""
        return _Last(
            "".join(x.text for x in lasts),
            tuple(i for x in lasts for i in x.token_ids),
            sum(x.prompt_tokens for x in lasts),
            sum(x.completion_tokens for x in lasts),
            sum(x.cached_tokens for x in lasts),
            next((x.finish_reason for x in lasts if x.finish_reason not in (None, "stop", "length")), "stop"),
        )


async def _generate(engine: Engine, req: GenerationRequest, until: Callable[[str], object] | None = None) -> _Last:
    """Run one generation to its end, or until `until(text so far)` is truthy (a decided
    label, a title's line end); leaving early aborts it (shielded). A decided generation's
    finish reason is None."""
    text: list[str] = []
    ids: list[int] = []
    last: TokenDelta | None = None
    stream = engine.generate(req)
    try:
        async with contextlib.aclosing(stream) as deltas:
            async for delta in deltas:
                text.append(delta.text)
                ids += delta.token_ids
                last = delta
                if until is not None and delta.finish_reason is None and until("".join(text)):
                    break
    finally:
        if last is None or last.finish_reason is None:
            with anyio.CancelScope(shield=True):
                await engine.abort(req.request_id)
    if last is None:
        return _Last("", (), 0, 0, 0, "abort")
    return _Last(
        "".join(text), tuple(ids), last.prompt_tokens, last.completion_tokens, last.cached_tokens, last.finish_reason
    )
