"""Quick-instruction heads: short side tasks run as continuations of a conversation's prompt.

Knows: the six heads (action, query, authority, domain, title, read_url), where each sits
(`title` after the assistant's answer, the others after the user turn), how a head's
prompt is rendered (the conversation with `task` on its last message, so the templates add
the format's own task token or instruction suffix and everything before it is
byte-identical to the main prompt), the regex that constrains a categorical head, the
token bound of a text head, how a head's output decodes, and how heads run concurrently
(beside a main generation or on their own). Does not know: HTTP, pydantic, vllm, or any
format's syntax (that lives in `formats.py` / the templates).

KV reuse is the engine's business: with prefix caching on, a head's prompt shares every
full cache block of the conversation with the main prompt, so it pays only for its suffix
(the conversation's partial last block plus the instruction: `--block-size` sets the block).
Each head reports `cached_tokens / prompt_tokens` as its prefix-cache hit rate.

Deciding early (constrained heads, `QuickConfig.decide_early`): a categorical head's answer
is fixed as soon as the text written so far is a prefix of one admitted label spelling
only; from there the grammar forces the rest, so greedy decoding would write exactly that
spelling. The head stops reading once the answer is decided (closing the stream aborts it
in the engine) and completes the label itself: the same answer as the full greedy
constrained decode, read after one token when the labels' first letters differ, two for the
default domains. It asks for max_tokens = `Choice.deciding_bytes()` (every token writes at
least one byte, so the answer is decided by then) with the constraint processor's budget
closing off for that request: budget closing narrows a row's mask to what still fits in its
max_tokens, so max_tokens=1 under it changed which label greedy decoding picked (measured:
"News" instead of "Law"), while the grammar's mask alone is the one the full decode sees in
its first steps (its max_tokens leaves every label room). The engine then stops the row by
itself instead of running until the abort lands. Labels where one spelling is a prefix of
another (only EOS decides) keep the full decode's request.
`read_url` decides each URL in its own request, concurrently: the head prompt plus the
forced line start "URL:" (as the answer's first line would begin), then " yes" or " no"
under a grammar with max_tokens=2, decided the same way. Each URL's answer is therefore conditioned on the
conversation and that URL alone, not on the answers written for the URLs before it (the
full decode, used with `decide_early=False` or unconstrained, writes all lines in one go,
one step per token of every URL).

Text heads are length-bounded: `title` at 16 tokens (the instruction asks for at most eight
words, ~1.3 tokens a word in English plus quotes; it stops at the line's end), `query` at 32
(a web query is 2-6 words, so about three queries; a search step rarely runs more).

Outputs: `action` -> "search" | "answer"; `read_url` -> {url: bool} for each URL in the
last user message; `query` -> list of strings; `authority`, `domain`, `title` -> string.
A head whose output cannot be read (only possible unconstrained) answers None.
`HeadRun.text` is the answer as written in full (a decided label completed, each read_url
line with its forced start); `token_ids` are only the tokens the model generated.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

import anyio

from callgate import templates
from callgate.errors import InvalidRequestError, TemplateError
from callgate.formats import get_format
from callgate.serving.engine import Engine, GenerationRequest, SamplingParams, TokenDelta
from callgate.serving.prompt import untrusted_spans

Position = Literal["user", "answer"]
Output = Literal["choice", "urls", "lines", "text"]
Spans = tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class HeadSpec:
    """One head: where it sits, how its output is read, and its token bound."""

    task: str
    position: Position
    output: Output
    max_tokens: int
    stop: tuple[str, ...] = ()


HEADS: Mapping[str, HeadSpec] = MappingProxyType(
    {
        "action": HeadSpec("action", "user", "choice", 8),
        "query": HeadSpec("query", "user", "lines", 32),
        "authority": HeadSpec("authority", "user", "choice", 16),
        "domain": HeadSpec("domain", "user", "choice", 16),
        "title": HeadSpec("title", "answer", "text", 16, stop=("\n",)),
        "read_url": HeadSpec("read_url", "user", "urls", 0),  # bound: the URL lines' length
    }
)

ACTION_LABELS = ("search", "answer")
DEFAULT_LABELS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "authority": ("low", "medium", "high"),
        "domain": (
            "general",
            "science",
            "technology",
            "programming",
            "health",
            "finance",
            "law",
            "politics",
            "news",
            "sports",
            "entertainment",
            "travel",
            "education",
            "shopping",
        ),
    }
)
MAX_QUERIES = 8
_URL = re.compile(r"https?://[^\s<>\"'`]+")
_URL_TRAILER = ".,;:!?)]}>"


@dataclass(frozen=True, slots=True)
class QuickConfig:
    """Server-wide head settings: label sets of the categorical heads, constrained or not, and
    whether constrained categorical heads stop once their answer is decided (module docstring)."""

    labels: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: DEFAULT_LABELS)
    constrained: bool = True
    decide_early: bool = True


# ---- tasks, prompts, grammars --------------------------------------------------------------


def check_tasks(fmt: str, tasks: Sequence[str], param: str = "tasks") -> tuple[str, ...]:
    """The requested tasks, duplicates dropped; 400 naming an unknown task or a format without heads."""
    known = get_format(fmt).quick_tasks
    for i, task in enumerate(tasks):
        if task not in HEADS or task not in known:
            names = ", ".join(t for t in HEADS if t in known) or "none"
            raise InvalidRequestError(
                f"{param}[{i}]: unknown quick task {task!r} for format {fmt} (known: {names})", param=param
            )
    return tuple(dict.fromkeys(tasks))


def urls_in(messages: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """The distinct URLs of the last user message, in order (trailing punctuation dropped)."""
    for m in reversed(messages):
        if m.get("role") == "user":
            found = (u.rstrip(_URL_TRAILER) for u in _URL.findall(_text(m.get("content"))))
            return tuple(dict.fromkeys(u for u in found if u))
    return ()


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    return ""


def with_task(messages: Sequence[Mapping[str, Any]], task: str) -> list[Mapping[str, Any]]:
    """The conversation with `task` on its last message (one more, empty user message where
    the last one cannot carry it), so the rendered prefix equals the main prompt's."""
    msgs = list(messages)
    if msgs and msgs[-1].get("role") == "user":
        msgs[-1] = {**msgs[-1], "task": task}
    else:
        msgs.append({"role": "user", "content": "", "task": task})
    return msgs


@dataclass(frozen=True, slots=True)
class HeadPrompt:
    text: str
    spans: Spans


def head_prompt(
    fmt: str,
    messages: Sequence[Mapping[str, Any]],
    task: str,
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    thinking: bool = False,
    reasoning_effort: str | None = None,
) -> HeadPrompt:
    """The rendered prompt of one head and its untrusted spans. Raises TemplateError (400)."""

    def render(msgs: Sequence[Mapping[str, Any]]) -> str:
        return templates.render(fmt, msgs, tools, thinking=thinking, reasoning_effort=reasoning_effort)

    msgs = list(messages)
    if msgs and msgs[-1].get("role") != "user":
        try:  # some templates write a task on any last message as one more user turn
            text = render([*msgs[:-1], {**msgs[-1], "task": task}])
            msgs[-1] = {**msgs[-1], "task": task}
            return HeadPrompt(text, untrusted_spans(render, msgs, text))
        except TemplateError:
            pass
    msgs = with_task(msgs, task)
    text = render(msgs)
    return HeadPrompt(text, untrusted_spans(render, msgs, text))


def _literal(text: str) -> str:
    return "".join("\\" + c if c in "\\.+*?()|[]{}^$#&-~" else c for c in text)


def head_regex(task: str, labels: Mapping[str, tuple[str, ...]], urls: Sequence[str]) -> str | None:
    """The regex of a categorical head's whole output; None for a free-text head."""
    spec = HEADS[task]
    if spec.output == "urls":
        return "\\n".join(_literal(u) + ": (?:yes|no)" for u in urls)
    if spec.output != "choice":
        return None
    words = ACTION_LABELS if task == "action" else labels[task]
    return "(?:" + "|".join(_label(w) for w in words) + ")"


def _label(word: str) -> str:
    """A label, its first letter in either case (DeepSeek writes "Search"); decoding folds case."""
    first = {word[0].lower(), word[0].upper()}
    head = _literal(first.pop()) if len(first) == 1 else "(?:" + "|".join(_literal(c) for c in sorted(first)) + ")"
    return head + _literal(word[1:])


@dataclass(frozen=True, slots=True)
class Choice:
    """A categorical answer as its grammar admits it: each spelling and the label it means.

    `decided(text)` is the spelling greedy constrained decoding is bound to finish once it has
    written `text`: the only spelling `text` is a prefix of (None while several remain)."""

    spellings: tuple[tuple[str, str], ...]  # (text as written, label)

    def decided(self, text: str, eos: bool = False) -> tuple[str, str] | None:
        if eos:  # the model ended: the text must be a whole spelling
            return next((s for s in self.spellings if s[0] == text), None)
        fits = [s for s in self.spellings if s[0].startswith(text)]
        return fits[0] if text and len(fits) == 1 else None

    def deciding_bytes(self) -> int | None:
        """The most UTF-8 bytes any spelling needs before `decided` names it: a bound on the
        tokens that decide (every token writes at least one byte). None when a spelling is a
        prefix of another (only EOS decides it)."""
        most = 0
        for text, _ in self.spellings:
            k = next((k for k in range(1, len(text) + 1) if self.decided(text[:k]) is not None), None)
            if k is None:
                return None
            most = max(most, len(text[:k].encode()))
        return most


def head_choice(task: str, labels: Mapping[str, tuple[str, ...]]) -> Choice:
    """The spellings `head_regex` admits for a categorical head (first letter in either case)."""
    words = ACTION_LABELS if task == "action" else labels[task]
    spellings = {c + w[1:]: w for w in words for c in (w[0].lower(), w[0].upper())}
    return Choice(tuple(spellings.items()))


URL_CHOICE = Choice(((" yes", "yes"), (" no", "no")))  # after the forced line start "URL:"


@dataclass(frozen=True, slots=True)
class HeadConstraint:
    """A ConstraintRef for the engine: the regex and its cache key."""

    key: str
    regex: str
    mode: str = "quick"
    trigger: str | None = None
    budget_closing: bool = True  # the processor's budget closing (off: the grammar's mask alone)


def head_constraint(regex: str) -> HeadConstraint:
    return HeadConstraint("quick:" + hashlib.sha256(regex.encode()).hexdigest()[:32], regex)


def head_max_tokens(task: str, urls: Sequence[str]) -> int:
    spec = HEADS[task]
    if spec.output == "urls":  # every token is at least one character of the fixed lines
        return sum(len(u) + len(": yes\n") for u in urls) + 1
    return spec.max_tokens


# ---- decoding ---------------------------------------------------------------------------------


def decode(task: str, text: str, labels: Mapping[str, tuple[str, ...]], urls: Sequence[str]) -> Any:
    """A head's output as the API returns it; None where the text is not a valid answer."""
    spec = HEADS[task]
    if spec.output == "choice":
        word = text.strip().strip(".").lower()
        allowed = ACTION_LABELS if task == "action" else labels[task]
        return next((w for w in allowed if w.lower() == word), None)
    if spec.output == "urls":
        return _decode_urls(text, urls)
    if spec.output == "lines":
        lines = (re.sub(r"^(?:[-*\u2022]|\d+[.)])\s*", "", ln.strip()).strip() for ln in text.splitlines())
        return [ln for ln in lines if ln][:MAX_QUERIES]
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line.strip("\"'*#").strip() or None


def _decode_urls(text: str, urls: Sequence[str]) -> dict[str, bool] | None:
    said: dict[str, bool] = {}
    for line in text.splitlines():
        url, sep, answer = line.strip().rpartition(":")
        if sep and url.strip() in urls and answer.strip().lower() in ("yes", "no"):
            said[url.strip()] = answer.strip().lower() == "yes"
    if set(said) != set(urls):
        return None
    return {u: said[u] for u in urls}


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
        sampling = SamplingParams(max_tokens, 0.0, 1.0, None, spec.stop)
        last = await _generate(
            self.engine, GenerationRequest(request_id, prompt.text, sampling, constraint, prompt.spans), choice
        )
        said = choice.decided(last.text, last.finish_reason == "stop") if choice is not None else None
        text, output = (said[0], said[1]) if said else (last.text, decode(task, last.text, label_sets, urls))
        return last.run(task, output, text)

    async def _read_urls(self, prompt: HeadPrompt, urls: Sequence[str], request_id: str) -> HeadRun:
        """read_url decided per URL, concurrently: the head prompt, the forced "URL:", then
        " yes" or " no" (module docstring). The URL is content: special-token text stays text."""
        constraint = await self._constraint(" (?:yes|no)")
        # " y" / " n" decide, so two tokens always do; with max_tokens=2 the processor's budget
        # closing lets only a whole " yes" / " no" token start (one step), not a lone " ".
        sampling = SamplingParams(2, 0.0)
        n = len(prompt.text)
        reqs = [
            GenerationRequest(
                f"{request_id}-{i}", f"{prompt.text}{u}:", sampling, constraint, (*prompt.spans, (n, n + len(u)))
            )
            for i, u in enumerate(urls)
        ]
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(_generate(self.engine, r, URL_CHOICE)) for r in reqs]
        lasts = [t.result() for t in tasks]
        said = [URL_CHOICE.decided(x.text, x.finish_reason == "stop") for x in lasts]
        output = None if None in said else {u: d[1] == "yes" for u, d in zip(urls, said, strict=True) if d}
        text = "\n".join(f"{u}:{d[0] if d else x.text}" for u, d, x in zip(urls, said, lasts, strict=True))
        return _Last.merged(lasts).run("read_url", output, text)

    async def _constraint(self, regex: str) -> HeadConstraint | None:
        """The regex's ref, its Index compiled into the shared cache (None: unconstrained)."""
        if not self.config.constrained:
            return None
        from callgate.constraints import get_index, token_vocabulary

        if self._vocabulary is None:
            tok = self.engine.tokenizer
            tokens = await anyio.to_thread.run_sync(tok.vocabulary)
            self._vocabulary = token_vocabulary(tokens, tok.eos_token_id)
        ref = head_constraint(regex)
        await anyio.to_thread.run_sync(get_index, ref.key, ref.regex, self._vocabulary)
        return ref

    def beside(self, conversation: Conversation, tasks: Sequence[str], request_id: str) -> QuickBeside:
        """Heads to run beside a main generation (tasks checked now, nothing started); see QuickBeside."""
        return QuickBeside(self, conversation, check_tasks(self.format, tasks, param="callgate.quick"), request_id)


@dataclass(slots=True)
class QuickBeside:
    """Heads beside a chat completion. `launch()` starts the user-position heads: call it once
    the main generation's first token is out, because only then is the conversation's KV in
    the prefix cache (heads scheduled in the same step as the main prefill would compute it
    again). `finish(answer)` launches them if that never happened, runs the answer-position
    heads on the conversation plus the answer and returns every result; `cancel()` stops
    whatever still runs (the chat failed or the client left)."""

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


async def _generate(engine: Engine, req: GenerationRequest, until: Choice | None = None) -> _Last:
    """Run one generation to its end, or until `until` is decided; leaving early aborts it
    (shielded). A decided generation's finish reason is None."""
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
                if until is not None and delta.finish_reason is None and until.decided("".join(text)):
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
