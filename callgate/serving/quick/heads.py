"""What a quick-instruction head is: its task, placement, prompt, grammar, bound and decoding.

Knows: the six heads (action, query, authority, domain, title, read_url), where each sits
(`title` after the assistant's answer, the others after the user turn), how a head's
prompt is rendered (the conversation with `task` on its last message, so the templates add
the format's own task token or instruction suffix and everything before it is
byte-identical to the main prompt), the regex that constrains a categorical head, which
label spelling a partial answer is bound to (`Choice`), the token bound of a text head, and
how a head's output decodes. Does not know: engines, requests or concurrency (`quick.py`
runs heads), HTTP, or any format's syntax (that lives in `callgate/formats/` and the templates).

Text heads are length-bounded: `title` at 16 tokens (the instruction asks for at most eight
words, ~1.3 tokens a word in English plus quotes, which leaves room for a blank line or two
before it; it stops at the end of its first line with text, `first_line`: some models
start the answer with a newline), `query` at 32 (a web query is 2-6 words, so about three
queries; a search step rarely runs more; `decode` skips its blank lines).

Outputs: `action` -> "search" | "answer"; `read_url` -> {url: bool} for each URL in the
last user message; `query` -> list of strings; `authority`, `domain`, `title` -> string.
A head whose output cannot be read (only possible unconstrained) answers None.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from callgate import templates
from callgate.errors import InvalidRequestError, TemplateError
from callgate.formats import get_format
from callgate.serving.prompt import Spans, untrusted_spans

Position = Literal["user", "answer"]
Output = Literal["choice", "urls", "lines", "text"]


@dataclass(frozen=True, slots=True)
class HeadSpec:
    """One head: where it sits, how its output is read, and its token bound. `stop`: the
    strings that end a text head once it has written text (`first_line`); callgate reads
    them itself, since an engine stop string would also fire on blank lines before the text."""

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
_URL = re.compile(r"https?://[^\s<>\"'`]+", re.IGNORECASE)  # URL schemes are case-insensitive
_URL_TRAILER = ".,;:!?"  # sentence punctuation after a URL, not part of it
_URL_CLOSERS = {")": "(", "]": "[", "}": "{"}  # part of the URL when balanced: wiki/Python_(language)


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
    """The distinct URLs of the last user message, in order, spelled as in the message;
    trailing sentence punctuation and unbalanced closing brackets are not part of a URL."""
    for m in reversed(messages):
        if m.get("role") == "user":
            found = (_trim_url(u) for u in _URL.findall(_text(m.get("content"))))
            return tuple(dict.fromkeys(u for u in found if _URL.fullmatch(u)))
    return ()


def _trim_url(url: str) -> str:
    """`url` without what follows it in prose: "(see https://a.test/x)." -> https://a.test/x.
    Linear in the URL's length (a message may hold a megabyte-long one)."""
    closers = {c: url.count(c) for c in _URL_CLOSERS}
    openers = {c: url.count(o) for c, o in _URL_CLOSERS.items()}
    end = len(url)
    while end:
        last = url[end - 1]
        if last in closers and openers[last] < closers[last]:
            closers[last] -= 1
        elif last not in _URL_TRAILER:
            break
        end -= 1
    return url[:end]


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
    """The regex of a categorical head's whole output; None for a free-text head. It ends
    with `$`, as the regex baseline's tool grammars do (benchmarks/regex_baseline/grammar.py): without it
    outlines-core drops the way on from an accepting state, so of the labels "Law" and
    "Lawyer" only "Law" could be written."""
    spec = HEADS[task]
    if spec.output == "urls":
        return "(?:" + "\\n".join(_literal(u) + ": (?:yes|no)" for u in urls) + ")$"
    if spec.output != "choice":
        return None
    words = ACTION_LABELS if task == "action" else labels[task]
    return "(?:" + "|".join(_label(w) for w in words) + ")$"


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
    """A ConstraintRef for the engine: the head's regex as an llguidance grammar, its key."""

    key: str
    grammar: str
    plain: str
    mode: str = "quick"
    trigger: str | None = None
    # No budget closing: a head's max_tokens holds its whole output by construction, and a
    # closing plan from a label's start would pick the label instead of the model.
    budget_closing: bool = False


def head_constraint(regex: str) -> HeadConstraint:
    """`regex` matches a head's whole output (llguidance anchors it at both ends: the `$`
    that outlines-core needed is dropped)."""
    import llguidance

    body = regex[:-1] if regex.endswith("$") and not regex.endswith("\\$") else regex
    grammar = llguidance.LLMatcher.grammar_from_regex(body)
    return HeadConstraint("quick:" + hashlib.sha256(regex.encode()).hexdigest()[:32], grammar, grammar)


def head_max_tokens(task: str, urls: Sequence[str]) -> int:
    spec = HEADS[task]
    if spec.output == "urls":  # every token is at least one character of the fixed lines
        return sum(len(u) + len(": yes\n") for u in urls) + 1
    return spec.max_tokens


# ---- decoding ---------------------------------------------------------------------------------


def first_line(text: str, ends: Sequence[str]) -> str | None:
    """`text` up to the first of `ends` after its first character other than whitespace
    (the blank lines before it kept); None while no such end is written."""
    start = len(text) - len(text.lstrip())
    hits = [i for i in (text.find(e, start) for e in ends if e) if i >= 0]
    return text[: min(hits)] if start < len(text) and hits else None


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
