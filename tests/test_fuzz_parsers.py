"""Parser fuzzing, every format: mutated golden outputs and hostile text never break a parser.

Knows: the golden decode corpus of each format, a deterministic mutation engine (slices
deleted, duplicated and spliced; format markers and special tokens inserted; random
bytes decoded with surrogateescape; lone surrogates raw and as JSON escapes; deep
nesting; huge numbers) and the invariants every parse must keep: no exception escapes
`parse` / `feed` / `finish`; streaming in pieces gives exactly `parse`'s result; each
candidate's `raw` is the text at its `span`; no candidate overlaps a malformed block
(a diagnostic other than `unknown_tool`, which is attached to a well-formed call); the
call-outside-markup detector (parsers/outside_markup.py) never raises on the result, finds
nothing beside a candidate, and names a declared tool at a span inside the text.
Does not know: how fast parsing is; `benchmarks/bench_reliability.py` runs the same
engine over a million inputs and checks linear time by input-size scaling.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from callgate.formats import FORMATS, get_format
from callgate.parsers import parse, stream_parser
from callgate.parsers.base import tool_names
from callgate.parsers.outside_markup import find_call_outside_markup
from callgate.types import ParseResult
from tests.conftest import load_jsonl

GOLDEN_FILES = {
    "dsml-v3.2": "dsml/decode_dsv32.jsonl",
    "dsml-v4": "dsml/decode_dsv4.jsonl",
    "qwen3-xml": "qwen3-xml/decode.jsonl",
    "hermes": "hermes/decode.jsonl",
    "hermes-qwen2.5": "hermes/decode.jsonl",  # the same calls; its reasoning cases are left out
    "llama3-json": "llama3-json/decode.jsonl",
    "mistral": "mistral/decode.jsonl",
}


@dataclass(frozen=True, slots=True)
class Seed:
    """One golden model output with the request context it was parsed under."""

    text: str
    tools: Sequence[Mapping[str, Any]] | None
    thinking: bool


@cache
def seeds(format: str) -> tuple[Seed, ...]:
    """The format's golden decode cases."""
    out: list[Seed] = []
    for case in load_jsonl(GOLDEN_FILES[format]):
        thinking = bool(case.get("thinking")) or case.get("thinking_mode") == "thinking"
        if get_format(format).reasoning_open is None and (thinking or "<think>" in case["completion_text"]):
            continue  # a format without reasoning reads none of it
        out.append(Seed(case["completion_text"], case.get("tools"), thinking))
    return tuple(out)


@cache
def fragments(format: str) -> tuple[str, ...]:
    """Texts a mutation inserts: the format's markers and special tokens, their halves, and
    hostile JSON / text bits."""
    fmt = get_format(format)
    marks = [fmt.eos, fmt.call_trigger, fmt.bos, *fmt.special_tokens, *fmt.markers.texts()]
    marks += [m for m in (fmt.reasoning_open, fmt.reasoning_close) if m]
    marks = [m for m in marks if m]
    halves = [m[: len(m) // 2] for m in marks if len(m) > 1]
    hostile = ['"', "\\", "{", "}", "[", "]", ":", ",", "<", ">", "/", "=", "\n", "\x00", "\ud800", "\udcff",
               "\\ud800", "\\udc00x", "\\u00", "1e99999", "-0.0e-9999", "9" * 400, "NaN", "true", "null", "é",
               "\U0001f600", '{"name": "x", "arguments": {}}', "</parameter>", "</function>", "<parameter=a>",
               "</tool_call>"]  # fmt: skip
    return tuple(marks + halves + hostile)


def mutate(text: str, rng: random.Random, format: str, donor: str) -> str:
    """One to three random mutations of `text` (deterministic for a seeded `rng`)."""
    for _ in range(rng.randint(1, 3)):
        text = rng.choice(MUTATIONS)(text, rng, format, donor)
    return text


def _cut(text: str, rng: random.Random) -> tuple[int, int]:
    i = rng.randint(0, len(text))
    return i, min(len(text), i + rng.randint(0, 16))


def _delete(text: str, rng: random.Random, format: str, donor: str) -> str:
    i, j = _cut(text, rng)
    return text[:i] + text[j:]


def _duplicate(text: str, rng: random.Random, format: str, donor: str) -> str:
    i, j = _cut(text, rng)
    return text[:j] + text[i:j] + text[j:]


def _insert_fragment(text: str, rng: random.Random, format: str, donor: str) -> str:
    i = rng.randint(0, len(text))
    return text[:i] + rng.choice(fragments(format)) + text[i:]


def _splice(text: str, rng: random.Random, format: str, donor: str) -> str:
    i, j = rng.randint(0, len(text)), rng.randint(0, len(donor))
    return text[:i] + donor[j:]


def _truncate(text: str, rng: random.Random, format: str, donor: str) -> str:
    return text[: rng.randint(0, len(text))]


def _random_bytes(text: str, rng: random.Random, format: str, donor: str) -> str:
    """Invalid UTF-8 as a decoder with surrogateescape would hand it over (U+DC80..U+DCFF)."""
    junk = bytes(rng.randrange(256) for _ in range(rng.randint(1, 12))).decode("utf-8", "surrogateescape")
    i = rng.randint(0, len(text))
    return text[:i] + junk + text[i:]


def _deep_nesting(text: str, rng: random.Random, format: str, donor: str) -> str:
    depth = rng.choice((64, 1000, 5000))
    opener = rng.choice(("[", '{"a": ', "<parameter=a>"))
    i = rng.randint(0, len(text))
    return text[:i] + opener * depth + text[i:]


def _huge_number(text: str, rng: random.Random, format: str, donor: str) -> str:
    digits = [k for k, ch in enumerate(text) if ch.isdigit()]
    i = rng.choice(digits) if digits else rng.randint(0, len(text))
    big = rng.choice(("9" * 5000, "9" * 400, "1e308", "1e309", "-" + "1" * 2000 + ".5e-400", "12345678901234567890"))
    return text[:i] + big + text[i:]


def _flip_char(text: str, rng: random.Random, format: str, donor: str) -> str:
    if not text:
        return text
    i = rng.randrange(len(text))
    return text[:i] + chr(rng.choice((0, 9, 10, 34, 39, 60, 62, 92, 123, 125, 0xD800, 0xDFFF, 0xFFFD))) + text[i + 1 :]


MUTATIONS: tuple[Callable[[str, random.Random, str, str], str], ...] = (
    _delete, _duplicate, _insert_fragment, _insert_fragment, _splice, _truncate,
    _random_bytes, _deep_nesting, _huge_number, _flip_char,
)  # fmt: skip


def check_invariants(format: str, seed: Seed, text: str, rng: random.Random | None = None) -> ParseResult:
    """Parse `text`; with `rng`, also stream it in random pieces and require the same result.
    Raises AssertionError naming the broken invariant; any other exception is a crash."""
    result = parse(format, text, seed.tools, thinking=seed.thinking)
    if rng is not None:
        parser = stream_parser(format, seed.tools, thinking=seed.thinking)
        pos = 0
        while pos < len(text):
            step = rng.randint(1, 12)
            parser.feed(text[pos : pos + step])
            pos += step
        parser.finish()
        streamed = parser.result()
        assert _comparable(streamed) == _comparable(result), "streaming differs from parse"
    malformed = [d.span for d in result.diagnostics if d.code != "unknown_tool" and d.span[1] > d.span[0]]
    for cand in result.candidates:
        assert text[cand.span[0] : cand.span[1]] == cand.raw, "raw is not the text at span"
        assert isinstance(cand.arguments, dict), "arguments are not an object"
        overlap = [s for s in malformed if s[0] < cand.span[1] and cand.span[0] < s[1]]
        assert not overlap, f"candidate {cand.span} overlaps malformed span(s) {overlap}"
    for truncated in (False, True):
        found = find_call_outside_markup(format, text, result, seed.tools, truncated=truncated)
        if found is not None:
            start, end = found.diagnostic.span
            assert not result.candidates, "a call outside markup beside a candidate"
            assert 0 <= start <= end <= len(text), "call_outside_markup span outside the text"
            assert found.name in (tool_names(seed.tools) or ()), "call_outside_markup names an undeclared tool"
    return result


def _comparable(r: ParseResult) -> tuple[Any, ...]:
    """A result without call ids (random per parser)."""
    calls = tuple((c.name, c.arguments, c.raw, c.span) for c in r.candidates)
    return r.content, r.reasoning, calls, r.diagnostics


# ---- tests (bounded: a few seconds per format) --------------------------------------------

ALL_FORMATS = sorted(FORMATS)


def test_every_format_has_a_golden_corpus() -> None:
    assert set(GOLDEN_FILES) == set(FORMATS)
    assert all(len(seeds(f)) >= 5 for f in ALL_FORMATS)


@pytest.mark.parametrize("format", ALL_FORMATS)
def test_golden_outputs_keep_the_invariants(format: str) -> None:
    rng = random.Random(0)
    for seed in seeds(format):
        check_invariants(format, seed, seed.text, rng)


@pytest.mark.parametrize("format", ALL_FORMATS)
def test_a_finished_parser_ignores_what_comes_after(format: str) -> None:
    """After finish() the result is final: more deltas (plain text, or the start of a call
    from another case) and a second finish() give no events and change nothing."""
    corpus = seeds(format)
    for seed, donor in zip(corpus, (*corpus[1:], corpus[0]), strict=True):
        parser = stream_parser(format, seed.tools, thinking=seed.thinking)
        for i in range(0, len(seed.text), 7):
            parser.feed(seed.text[i : i + 7])
        parser.finish()
        final = _comparable(parser.result())
        assert final == _comparable(parse(format, seed.text, seed.tools, thinking=seed.thinking))
        for later in (" and more text", donor.text, "<"):
            assert parser.feed(later) == [], f"{format}: feed after finish gave events"
        assert parser.finish() == []
        assert _comparable(parser.result()) == final, f"{format}: the result changed after finish"


@pytest.mark.parametrize("format", ALL_FORMATS)
def test_mutated_golden_outputs(format: str) -> None:
    rng = random.Random(f"mutate-{format}")
    corpus = seeds(format)
    for _ in range(400):
        seed, donor = rng.choice(corpus), rng.choice(corpus)
        text = mutate(seed.text, rng, format, donor.text)
        check_invariants(format, seed, text, rng)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(ALL_FORMATS), st.binary(max_size=200), st.integers(0, 2**32))
def test_random_bytes_as_surrogateescape_text(format: str, data: bytes, salt: int) -> None:
    text = data.decode("utf-8", "surrogateescape")
    check_invariants(format, seeds(format)[salt % len(seeds(format))], text, random.Random(salt))


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(ALL_FORMATS), st.lists(st.integers(0, 10**6), min_size=1, max_size=6))
def test_hypothesis_driven_mutations(format: str, choices: list[int]) -> None:
    rng = random.Random(choices[0])
    corpus = seeds(format)
    seed = corpus[choices[0] % len(corpus)]
    text = seed.text
    for c in choices[1:]:
        text = MUTATIONS[c % len(MUTATIONS)](text, rng, format, corpus[c % len(corpus)].text)
    check_invariants(format, seed, text, rng)


@pytest.mark.parametrize("format", ALL_FORMATS)
@pytest.mark.parametrize("opener", ["[", '{"a": ', "<parameter=a>", "<tool_call>"])
def test_deep_nesting_inside_a_call(format: str, opener: str) -> None:
    """A call block whose arguments nest 20 000 deep: a diagnostic, not a RecursionError."""
    seed = next((s for s in seeds(format) if parse(format, s.text, s.tools, thinking=s.thinking).candidates), None)
    assert seed is not None
    cand = parse(format, seed.text, seed.tools, thinking=seed.thinking).candidates[0]
    cut = cand.span[1] - len(cand.raw) // 3
    text = seed.text[:cut] + opener * 20_000 + seed.text[cut:]
    result = check_invariants(format, seed, text)
    assert len(result.candidates) <= len(parse(format, seed.text, seed.tools, thinking=seed.thinking).candidates)


def test_lone_surrogate_escape_is_never_a_crash() -> None:
    """JSON allows `\\ud800` escapes that Python cannot encode; a candidate may hold one, and
    nothing raises while reading it."""
    text = '<tool_call>\n{"name": "f", "arguments": {"a": "\\ud800", "b": "\\udc00\\ud83d"}}\n</tool_call>'
    result = check_invariants("hermes", Seed(text, None, False), text, random.Random(1))
    assert result.candidates or result.diagnostics


FOUND = [  # inputs the fuzzer once broke a parser with (kept as regressions)
    ("qwen3-xml", "<tool_call>\n<function=set_thermostat>\n<parameter=target_c>\n" + "9" * 400 + "\n</parameter>\n"),
    ("qwen3-xml", "<tool_call>\n<parameter=a>\n" + "9" * 5000 + "\n</parameter>"),
    ("qwen3-xml", '<tool_call>\n<function=get_weathhink>\n<tool_call>\n<function=get_weather>\n<parameter=location>\n'
     "Paris, FR\n</parameter>\n</function>\n</tool_call>\n</think>\n\n<|im_end|>"),
    ("qwen3-xml", "<tool_call>\n<<tool_call>\n<function=get_current_time>\n</function>\n</tool_call><|im_end|>"),
    ("qwen3-xml", "<tool_call>\n<function=f>\n<parameter=a>\nx<tool_call>\n<function=g>\n</function>\n</tool_call>"),
]  # fmt: skip


@pytest.mark.parametrize(("format", "text"), FOUND)
def test_found_by_fuzzing(format: str, text: str) -> None:
    for seed in seeds(format):
        result = check_invariants(format, seed, text, random.Random(0))
        assert result.diagnostics
