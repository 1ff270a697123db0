"""The lazy `auto` seam end to end: callgate.constraints builds the hermes grammar with its
trigger, ConstrainedBatch masks a scripted model's logits, callgate.parsers reads the text.

The "model" is a byte-level vocabulary (every byte, plus a few multi-byte pieces) whose
logits are seeded noise plus a large bonus on the token that continues the text it
intends to write; the mask alone decides when that intention is overruled.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from callgate.constraints import build
from callgate.constraints.processor import ConstrainedBatch, TokenTable
from callgate.parsers import parse

PIECES = [b"<tool_call>", b"Sure", b" I", b"get_weather", b"arguments", b"</tool_call>"]
TOKENS = {bytes([b]): [b] for b in range(256)} | {p: [256 + i] for i, p in enumerate(PIECES)}
EOS = 256 + len(PIECES)
WIDTH = EOS + 3
TABLE = TokenTable.build(TOKENS, EOS, {})
TEXT = {i: data for data, ids in TOKENS.items() for i in ids} | {EOS: b""}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
]


class ByteBatch(ConstrainedBatch):
    def load_tokens(self) -> TokenTable:
        return TABLE


def next_piece(intended: bytes) -> tuple[int, int] | None:
    """(token, length) of the longest vocabulary piece that starts `intended`."""
    for end in range(min(len(intended), 16), 0, -1):
        if intended[:end] in TOKENS:
            return TOKENS[intended[:end]][0], end
    return None


def generate(intended: str, seed: int) -> tuple[str, list[int]]:
    """Sample greedily under the mask; returns the text and how many logits survived each step."""
    constraint = build("hermes", TOOLS, "auto", False, None, None)  # one call: the tests read exactly one
    assert constraint is not None and constraint.trigger == "<tool_call>"
    ref = {"key": constraint.key, "regex": constraint.regex, "mode": constraint.mode, "trigger": constraint.trigger}
    batch = ByteBatch(None, "cpu", False)
    out: list[int] = []
    params = SimpleNamespace(extra_args={"callgate": ref})
    batch.update_state(SimpleNamespace(removed=[], added=[(0, params, None, out)], moved=[]))
    gen = torch.Generator().manual_seed(seed)
    want, cursor, survivors = intended.encode(), 0, []
    for _ in range(400):
        logits = torch.randn(1, WIDTH, generator=gen)
        piece = next_piece(want[cursor:])
        logits[0, piece[0] if piece else EOS] += 100.0
        batch.update_state(None)
        survivors.append(int(torch.isfinite(batch.apply(logits)).sum()))
        token = int(logits.argmax())
        out.append(token)
        if token == EOS:
            break
        cursor += piece[1] if piece and token == piece[0] else 0
    assert out[-1] == EOS, "the scripted model did not finish"
    return b"".join(TEXT[t] for t in out).decode(), survivors


def test_text_before_the_trigger_is_free_and_the_call_is_constrained() -> None:
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    text, survivors = generate("Sure, I will check.\n" + call, seed=1)
    assert text == "Sure, I will check.\n" + call
    free = len([b"Sure", b",", b" I", *(bytes([c]) for c in b" will check.\n"), b"<tool_call>"])
    assert all(n == WIDTH for n in survivors[:free])
    assert all(n < 20 for n in survivors[free : free + 3])  # "\n{" forced after the trigger
    result = parse("hermes", text, TOOLS)
    assert result.diagnostics == ()
    assert [(c.name, c.arguments) for c in result.candidates] == [("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize(
    "wrong",
    [
        '{"name": "get_wether", "arguments": {"city": "Oslo"}}',  # misspelt tool
        '{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2.5}}',  # float for an integer
        '{"name": "get_weather", "arguments": {"city": "Oslo"}',  # unbalanced braces
    ],
)
def test_the_mask_overrules_a_model_that_means_to_write_a_bad_call(wrong: str) -> None:
    text, _ = generate(f"Checking.\n<tool_call>\n{wrong}\n</tool_call>", seed=2)
    result = parse("hermes", text, TOOLS)
    assert result.diagnostics == ()
    assert [c.name for c in result.candidates] == ["get_weather"]
    assert result.candidates[0].arguments["city"] == "Oslo"
    assert isinstance(result.candidates[0].arguments.get("days", 0), int)
