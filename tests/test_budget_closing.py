"""Budget closing on SmolLM2's real vocabulary: a constrained output ends within max_tokens.

A fake "model" (seeded noise plus a strong preference for letters, or for digits) is
decoded greedily through ConstrainedBatch with vLLM-like batch updates, the way vLLM's
engine core drives it. Left alone, that model never closes a string value, so without
budget closing every output would be cut mid-call. Required grammars (hermes, dsml-v4,
qwen3-xml) over a tool with string, integer and nested-object parameters must end in EOS
within max_tokens and parse with no diagnostic into schema-valid arguments; max_tokens is
chosen relative to the grammar's shortest output (an exact fit, a little more, a lot more).
Below the shortest output the row is cut as before (the parser reports it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Any

import jsonschema
import pytest
import torch

import callgate.constraints as constraints
from callgate.constraints.automaton import Spelling, build_automaton
from callgate.constraints.budget import DEFAULT_BOUND, shortest_output_tokens
from callgate.constraints.processor import ConstrainedBatch, TokenTable
from callgate.formats import get_format
from callgate.parsers import parse
from tests.test_agreement import SmolTokenizer, _smol

pytestmark = pytest.mark.slow

FORMATS = ["hermes", "dsml-v4", "qwen3-xml"]
SCHEMA = {
    "type": "object",
    "properties": {
        "query": {"type": "string"},
        "limit": {"type": "integer"},
        "filter": {
            "type": "object",
            "properties": {"lang": {"type": "string"}, "year": {"type": "integer"}},
            "required": ["lang"],
        },
    },
    "required": ["query", "limit", "filter"],
}
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": SCHEMA}}]


@dataclass
class Params:
    extra_args: dict[str, Any]
    max_tokens: int | None


@dataclass(frozen=True)
class Update:
    batch_size: int
    removed: list[int] = field(default_factory=list)
    added: list[tuple[int, Params, list[int] | None, list[int]]] = field(default_factory=list)
    moved: list[tuple[int, int, Any]] = field(default_factory=list)


@cache
def table() -> TokenTable:
    smol = _smol()
    tokens: dict[bytes, list[int]] = {}
    for i, data in smol.bytes_of.items():
        tokens.setdefault(data, []).append(i)
    return TokenTable.build(tokens, smol.eos, {})


class SmolBatch(ConstrainedBatch):
    def load_tokens(self) -> TokenTable:
        return table()


@cache
def grammar(fmt: str, parallel: bool = False) -> constraints.Constraint:
    c = constraints.build(fmt, TOOLS, "required", parallel, None, _smol().vocab)
    assert c is not None
    return c


@cache
def shortest(fmt: str) -> int:
    """Tokens of the grammar's shortest output, EOS included (D of the initial state + 1)."""
    return shortest_output_tokens(grammar(fmt).index, table().by_bytes)


def test_the_shortest_output_is_what_the_tokenizer_makes_of_the_shortest_text() -> None:
    smol = _smol()
    for fmt in FORMATS:
        c = grammar(fmt)
        text = build_automaton(c.index, Spelling.of(table().by_bytes)).shortest_text(0)
        assert text is not None
        assert shortest(fmt) <= len(smol.encode(text.decode())) + 1  # longest-first is no worse here
        assert parse(fmt, text.decode() + get_format(fmt).eos, TOOLS).diagnostics == ()


def params(c: constraints.Constraint, max_tokens: int | None) -> Params:
    return Params({"callgate": {"key": c.key, "regex": c.regex, "trigger": c.trigger}}, max_tokens)


def decode(
    smol: SmolTokenizer, c: constraints.Constraint, max_tokens: int, prefer: bytes, seed: int, *, told: bool = True
) -> list[int]:
    """Greedy decoding of the fake model through a fresh batch (one request in slot 0);
    `told`: whether the request's params carry max_tokens."""
    batch = SmolBatch(None, "cpu", False)
    width = 32 * ((max(table().vocabulary.size, smol.eos + 1) + 31) // 32)
    favourite = [smol.byte_ids[b] for b in prefer]
    out: list[int] = []
    batch.update_state(Update(1, added=[(0, params(c, max_tokens if told else None), None, out)]))
    noise = torch.Generator().manual_seed(seed)
    while len(out) < max_tokens and smol.eos not in out:
        logits = torch.randn(1, width, generator=noise)
        logits[0, favourite] += 20.0
        batch.update_state(None)
        out.append(int(batch.apply(logits)[0].argmax()))
    return out


def text_of(smol: SmolTokenizer, ids: list[int]) -> str:
    return b"".join(smol.bytes_of.get(i, b"") for i in ids if i != smol.eos).decode("utf-8", errors="replace")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("extra", [0, 1, 9, 40])
@pytest.mark.parametrize("prefer", [b"abcdefgh", b"123456789"], ids=["letters", "digits"])
def test_a_model_that_never_closes_still_ends_with_a_valid_call(fmt: str, extra: int, prefer: bytes) -> None:
    smol, c = _smol(), grammar(fmt)
    max_tokens = shortest(fmt) + extra
    out = decode(smol, c, max_tokens, prefer, seed=extra)
    assert out[-1] == smol.eos and len(out) <= max_tokens
    result = parse(fmt, text_of(smol, out) + get_format(fmt).eos, TOOLS)
    assert result.diagnostics == (), (text_of(smol, out), result.diagnostics)
    assert [cand.name for cand in result.candidates] == ["lookup"]
    jsonschema.validate(result.candidates[0].arguments, SCHEMA)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_value_the_model_keeps_open_is_closed_at_exactly_max_tokens(fmt: str) -> None:
    smol = _smol()
    max_tokens = shortest(fmt) + 30
    out = decode(smol, grammar(fmt), max_tokens, b"abcdefgh", seed=1)
    assert len(out) == max_tokens and out[-1] == smol.eos  # the server reports "length" for this


@pytest.mark.parametrize("fmt", FORMATS)
def test_parallel_calls_close_too(fmt: str) -> None:
    smol, c = _smol(), grammar(fmt, parallel=True)
    out = decode(smol, c, shortest(fmt) + 25, b"abcdefgh", seed=3)
    assert out[-1] == smol.eos
    result = parse(fmt, text_of(smol, out) + get_format(fmt).eos, TOOLS)
    assert result.diagnostics == () and result.candidates
    for cand in result.candidates:
        jsonschema.validate(cand.arguments, SCHEMA)


@pytest.mark.parametrize("fmt", FORMATS)
def test_below_the_shortest_call_the_output_is_cut_as_before(fmt: str) -> None:
    smol = _smol()
    max_tokens = shortest(fmt) - 2
    out = decode(smol, grammar(fmt), max_tokens, b"abcdefgh", seed=0)
    assert len(out) == max_tokens and smol.eos not in out
    result = parse(fmt, text_of(smol, out) + get_format(fmt).eos, TOOLS)
    assert result.diagnostics and not result.candidates


def test_far_from_the_budget_masks_are_the_grammars_own() -> None:
    smol, c = _smol(), grammar("hermes")
    ids = smol.encode('<tool_call>\n{"name": "lookup", "arguments": {"query": "abc')
    masked = []
    for max_tokens in (None, DEFAULT_BOUND + len(ids) + 1):
        batch = SmolBatch(None, "cpu", False)
        batch.update_state(Update(1, added=[(0, params(c, max_tokens), None, list(ids))]))
        logits = torch.zeros(1, 32 * ((table().vocabulary.size + 31) // 32))
        masked.append(torch.isfinite(batch.apply(logits)))
    assert torch.equal(masked[0], masked[1]) and int(masked[0].sum()) > 1000  # a free string: most tokens
    assert ids == smol.encode(text_of(smol, ids))  # the prefix really is what the model would write


def test_without_max_tokens_in_the_params_nothing_is_closed() -> None:
    smol, c = _smol(), grammar("qwen3-xml")
    assert decode(smol, c, 80, b"abcdefgh", seed=0)[-1] == smol.eos
    assert smol.eos not in decode(smol, c, 80, b"abcdefgh", seed=0, told=False)


# ---- lazy `auto`: free text, then a trigger ------------------------------------------------

OPENING = '<tool_call>\n{"name": "lookup", "arguments": {"query": "'


def follow(smol: SmolTokenizer, c: constraints.Constraint, intended: str, max_tokens: int) -> list[int]:
    """A model that writes `intended` (then letters forever) wherever the mask lets it."""
    intended += "a" * 20 * max_tokens
    batch = SmolBatch(None, "cpu", False)
    width = 32 * ((max(table().vocabulary.size, smol.eos + 1) + 31) // 32)
    letters = [smol.byte_ids[b] for b in b"abcdefgh"]
    out: list[int] = []
    batch.update_state(Update(1, added=[(0, params(c, max_tokens), None, out)]))
    noise = torch.Generator().manual_seed(0)
    while len(out) < max_tokens and smol.eos not in out:
        logits = torch.randn(1, width, generator=noise)
        logits[0, letters] += 10.0
        written = b"".join(smol.bytes_of.get(i, b"") for i in out)
        if intended.encode().startswith(written):
            logits[0, smol.encode(intended.encode()[len(written) :].decode(errors="ignore"))[0]] += 20.0
        batch.update_state(None)
        out.append(int(batch.apply(logits)[0].argmax()))
    return out


@cache
def lazy() -> constraints.Constraint:
    c = constraints.build("hermes", TOOLS, "auto", False, None, _smol().vocab)
    assert c is not None and c.trigger == "<tool_call>"
    return c


def test_a_call_started_in_time_closes_within_max_tokens() -> None:
    smol = _smol()
    out = follow(smol, lazy(), "Let me look. " + OPENING, max_tokens=80)
    assert out[-1] == smol.eos and len(out) == 80
    result = parse("hermes", text_of(smol, out) + "<|im_end|>", TOOLS)
    assert result.diagnostics == () and result.content == "Let me look. "
    jsonschema.validate(result.candidates[0].arguments, SCHEMA)


@pytest.mark.parametrize("prefix_words", [10, 20, 30])
def test_a_trigger_too_late_to_close_is_held_back(prefix_words: int) -> None:
    smol = _smol()
    intended = "word " * prefix_words + OPENING
    max_tokens = len(smol.encode("word " * prefix_words)) + 20  # a whole call needs about 35
    out = follow(smol, lazy(), intended, max_tokens)
    text = text_of(smol, out)
    assert "<tool_call>" not in text and text.startswith("word " * prefix_words)
    result = parse("hermes", text + "<|im_end|>", TOOLS)
    assert result.diagnostics == () and not result.candidates
