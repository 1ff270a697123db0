"""Format-independent test machinery shared by every format's tests.

* `assistant_completion`: what the model would have written for an assistant turn,
  derived from the renderer as render(ctx + [turn]) minus render(ctx, generation prompt).
* `check_split_invariance`: N seeded random splits into deltas give the same coalesced
  events and ParseResult as parse(text), the events carry the result (text deltas, the
  ones `finish()` releases included, concatenate to its content), and each call's
  argument deltas concatenate to its final arguments JSON.
* hypothesis strategies for random tool schemas and calls.
"""

from __future__ import annotations

import json
import random
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from hypothesis import strategies as st

from callgate.parsers import parse, sequential_call_ids, stream_parser
from callgate.serving.engines.fake_engine import FakeTokenizer
from callgate.templates import render
from callgate.types import (
    ArgumentsDelta,
    CallEnd,
    Event,
    ParseResult,
    ReasoningDelta,
    TextDelta,
    arguments_json,
    coalesce,
)


def assistant_completion(
    format: str,
    context: Sequence[Mapping[str, Any]],
    turn: Mapping[str, Any],
    tools: Sequence[Mapping[str, Any]] | None,
    *,
    thinking: bool = False,
    eos: str,
) -> str:
    """The completion text for `turn` after `context`, ending with the end-of-turn token."""
    prefix = render(format, context, tools, thinking=thinking, add_generation_prompt=True)
    full = render(format, [*context, turn], tools, thinking=thinking, add_generation_prompt=False)
    assert full.startswith(prefix), "rendering the turn changed the prompt before it"
    completion = full[len(prefix) :]
    end = completion.rfind(eos)
    assert end >= 0, f"rendered assistant turn does not end with {eos!r}"
    return completion[: end + len(eos)]


def _feed_all(format: str, pieces: list[str], tools: Any, thinking: bool) -> tuple[list[Event], ParseResult]:
    parser = stream_parser(format, tools, thinking=thinking, call_ids=sequential_call_ids())
    events: list[Event] = []
    for piece in pieces:
        events.extend(parser.feed(piece))
    events.extend(parser.finish())
    return events, parser.result()


def random_split(text: str, rng: random.Random, max_piece: int = 8) -> list[str]:
    pieces: list[str] = []
    i = 0
    while i < len(text):
        n = rng.randint(1, max_piece)
        pieces.append(text[i : i + n])
        i += n
    return pieces


def check_split_invariance(
    format: str,
    text: str,
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    thinking: bool = False,
    splits: int = 100,
    seed: int = 0,
) -> ParseResult:
    """Assert the streaming invariant on `splits` random splits; return parse(text)."""
    whole = parse(format, text, tools, thinking=thinking, call_ids=sequential_call_ids())
    ref_events, ref_result = _feed_all(format, [text], tools, thinking)
    assert ref_result == whole
    ref = coalesce(ref_events)
    rng = random.Random(seed)
    for k in range(splits):
        pieces = random_split(text, rng, max_piece=1 if k == 0 else rng.choice((2, 4, 8, 32)))
        events, result = _feed_all(format, pieces, tools, thinking)
        assert result == whole, f"split {k} changed the result"
        assert_events_carry_result(events, result)
        assert coalesce(events) == ref, f"split {k} changed the events"
        args: dict[int, str] = {}
        for ev in events:
            if isinstance(ev, ArgumentsDelta):
                args[ev.index] = args.get(ev.index, "") + ev.text
            elif isinstance(ev, CallEnd):
                assert args.get(ev.index, "") == arguments_json(ev.candidate.arguments)
    return whole


def assert_events_carry_result(events: Sequence[Event], result: ParseResult) -> None:
    """What a stream sends is the result: its text and reasoning deltas (those of `finish()`
    included) concatenate to the result's content and reasoning, its CallEnds are its
    candidates."""
    assert "".join(ev.text for ev in events if isinstance(ev, TextDelta)) == (result.content or "")
    assert "".join(ev.text for ev in events if isinstance(ev, ReasoningDelta)) == (result.reasoning or "")
    assert tuple(ev.candidate for ev in events if isinstance(ev, CallEnd)) == result.candidates


def calls_of(result: ParseResult) -> list[tuple[str, dict[str, Any]]]:
    return [(c.name, c.arguments) for c in result.candidates]


# ---- hypothesis strategies -------------------------------------------------------------

NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,15}", fullmatch=True)

_TEXT = st.text(
    alphabet=st.one_of(
        st.sampled_from(list("<>&\"'\\/\n\t {}[]:,=é漢🙂")),
        st.characters(blacklist_categories=("Cs",)),
    ),
    max_size=20,
)


def json_values(forbidden: Sequence[str] = (), max_leaves: int = 8) -> st.SearchStrategy[Any]:
    """JSON values: unicode strings with quotes, <, &, newlines, empty strings; numbers,
    booleans, null; nested objects and arrays. Strings never contain `forbidden` texts
    (a format's closing markers that it cannot represent inside a value)."""
    text = _TEXT.filter(lambda s: not any(f in s for f in forbidden)) if forbidden else _TEXT
    scalars = st.one_of(
        text,
        st.integers(min_value=-(10**12), max_value=10**12),
        st.floats(allow_nan=False, allow_infinity=False, width=64),
        st.booleans(),
        st.none(),
    )
    return st.recursive(
        scalars,
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.dictionaries(NAMES, children, max_size=4),
        ),
        max_leaves=max_leaves,
    )


def _schema_of(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, int):
        return {"type": "integer"}
    if isinstance(value, float):
        return {"type": "number"}
    if isinstance(value, str):
        return {"type": "string"}
    if value is None:
        return {"type": "null"}
    if isinstance(value, list):
        return {"type": "array"}
    return {"type": "object"}


@st.composite
def tool_and_calls(
    draw: st.DrawFn, forbidden: Sequence[str] = (), max_calls: int = 3
) -> tuple[list[dict[str, Any]], list[tuple[str, dict[str, Any]]]]:
    """(OpenAI tools list, calls as (name, arguments)) where every call fits its tool's schema."""
    n_tools = draw(st.integers(min_value=1, max_value=3))
    names = draw(st.lists(NAMES, min_size=n_tools, max_size=n_tools, unique=True))
    tools: list[dict[str, Any]] = []
    calls: list[tuple[str, dict[str, Any]]] = []
    for name in names:
        args = draw(st.dictionaries(NAMES, json_values(forbidden), max_size=4))
        props = {k: _schema_of(v) for k, v in args.items()}
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": draw(_TEXT.filter(lambda s: not any(f in s for f in forbidden))),
                    "parameters": {"type": "object", "properties": props, "required": sorted(props)},
                },
            }
        )
        calls.append((name, args))
    k = draw(st.integers(min_value=1, max_value=min(max_calls, len(calls))))
    return tools, calls[:k]


def openai_tool_calls(calls: Sequence[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """OpenAI-style assistant tool_calls (arguments as canonical JSON strings)."""
    return [
        {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
        }
        for i, (name, args) in enumerate(calls)
    ]


class CountingTokenizer(FakeTokenizer):
    """Records, for every text it tokenises, its length and whether it ran on the main thread
    (the event loop's)."""

    def __init__(self) -> None:
        super().__init__()
        self.encoded: list[tuple[int, bool]] = []

    def encode(self, text: str, untrusted_spans: tuple[tuple[int, int], ...] = ()) -> list[int]:
        self.encoded.append((len(text), threading.current_thread() is threading.main_thread()))
        return super().encode(text, untrusted_spans)


def distances_to_final(index: Any, edges: Callable[[int], Iterable[tuple[int, int]]]) -> dict[int, int]:
    """Steps from each state of `index` reachable from its start (following `edges(state)`:
    (label, next state) pairs) to the nearest final state; states that reach none are left out."""
    start = index.get_initial_state()
    seen, queue, back = {start}, deque([start]), dict[int, list[int]]()
    while queue:
        s = queue.popleft()
        for _, n in edges(s):
            back.setdefault(n, []).append(s)
            if n not in seen:
                seen.add(n)
                queue.append(n)
    dist = {s: 0 for s in seen if index.is_final_state(s)}
    queue = deque(dist)
    while queue:
        s = queue.popleft()
        for p in back.get(s, []):
            if p not in dist:
                dist[p] = dist[s] + 1
                queue.append(p)
    return dist


def streamed_text(events: Sequence[str]) -> tuple[str, str, list[str]]:
    """(content, reasoning_content, finish reasons) reassembled from a stream's `data:`
    payloads; the stream must end with [DONE] and send no error event."""
    assert events[-1] == "[DONE]"
    content, reasoning, finishes = "", "", []
    for raw in events[:-1]:
        chunk = json.loads(raw)
        assert "error" not in chunk, chunk
        for choice in chunk["choices"]:
            content += choice["delta"].get("content") or ""
            reasoning += choice["delta"].get("reasoning_content") or ""
            if choice["finish_reason"]:
                finishes.append(choice["finish_reason"])
    return content, reasoning, finishes
