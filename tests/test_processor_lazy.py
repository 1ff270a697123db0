"""The lazy `auto` seam end to end: callgate.constraints builds the hermes grammar with its
trigger, ConstrainedBatch masks a scripted model's logits, callgate.parsers reads the text.

The "model" is a byte-level vocabulary (every byte, plus a few multi-byte pieces) whose
logits are seeded noise plus a large bonus on the token that continues the text it
intends to write; the mask alone decides when that intention is overruled.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
import torch

from callgate.constraints import build
from callgate.constraints.processor import ConstrainedBatch, TokenTable
from callgate.formats import get_format
from callgate.parsers import parse
from callgate.serving.model_store import ModelNotFoundError, ensure_embedded_model
from callgate.serving.tokenizer import HfTokenizer

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
    assert all(n == WIDTH - 1 for n in survivors[:free])  # all but "</tool_call>": content may not hold it
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


# ---- the embedded model's vocabulary (SmolLM2): the QA 502 after a tool result ----------------

QA_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


class SmolBatch(ConstrainedBatch):
    """The processor over SmolLM2's real tokens (loaded once, as vLLM's engine loads them)."""

    def load_tokens(self) -> TokenTable:
        return smol_tokens()[0]


@functools.cache
def smol_tokens() -> tuple[TokenTable, HfTokenizer]:
    try:
        folder = ensure_embedded_model()
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    config = SimpleNamespace(model_config=SimpleNamespace(tokenizer=str(folder)))
    return ConstrainedBatch.load_tokens(SimpleNamespace(vllm_config=config)), HfTokenizer(folder)  # type: ignore[arg-type]


class SmolRow:
    """One hermes `auto` request (tools, no tool_choice) in a SmolBatch, fed `output`."""

    def __init__(self, output: list[int], max_tokens: int | None = None) -> None:
        table, self.tok = smol_tokens()
        self.table = table
        c = build("hermes", QA_TOOLS, None, None, None, table.vocabulary)
        assert c is not None and c.trigger == "<tool_call>"
        ref = {"key": c.key, "regex": c.regex, "trigger": c.trigger, "index_path": c.index_path}
        self.batch, self.output = SmolBatch(None, "cpu", False), output
        params = SimpleNamespace(extra_args={"callgate": ref}, max_tokens=max_tokens)
        self.batch.update_state(SimpleNamespace(removed=[], added=[(0, params, None, output)], moved=[]))
        self.width = 32 * ((max(table.vocabulary.size, max(table.pieces) + 1) + 31) // 32)

    def logits(self, scores: torch.Tensor | None = None) -> torch.Tensor:
        logits = torch.zeros(1, self.width) if scores is None else scores
        self.batch.update_state(None)
        return self.batch.apply(logits)

    def allowed(self) -> set[int]:
        return set(torch.isfinite(self.logits()[0]).nonzero().flatten().tolist())

    def text(self, ids: list[int]) -> bytes:
        return b"".join(self.table.pieces.get(i, b"") for i in ids if i != self.table.vocabulary.eos_token_id)


def encode(text: str) -> list[int]:
    return list(smol_tokens()[1].hf.encode(text, add_special_tokens=False))


def test_a_marker_begun_in_free_text_cannot_be_completed() -> None:
    row = SmolRow(encode("Sure <tool_response"))  # SmolLM2: "Sure", " <", "tool", "_", "response"
    text, pieces = row.text(row.output), row.table.pieces
    allowed = row.allowed()
    completing = {t for t, p in pieces.items() if b"<tool_response>" in text + p}
    assert completing and not completing & allowed
    assert encode("s")[0] in allowed  # "<tool_responses" is plain text
    # exact on this state: the parser rejects each banned token's text, accepts each allowed one's
    for t, piece in pieces.items():
        if t == row.table.vocabulary.eos_token_id or not piece.isascii():
            continue
        diagnostics = parse("hermes", (text + piece).decode(), QA_TOOLS).diagnostics
        assert (diagnostics == ()) == (t in allowed), (piece, diagnostics)


def test_a_token_that_is_a_whole_marker_is_masked_in_free_text() -> None:
    row = SmolRow([])
    eos, pieces = row.table.vocabulary.eos_token_id, row.table.pieces
    markers = {m.encode() for m in get_format("hermes").special_tokens}
    whole = {t for t, p in pieces.items() if p in markers and t != eos}
    assert whole == {t for t in pieces if pieces[t] in (b"<|endoftext|>", b"<|im_start|>")}  # SmolLM2's
    for output in ([], encode("The weather")):
        row = SmolRow(output)
        allowed = row.allowed()
        assert not whole & allowed and eos in allowed
        assert len(allowed) >= len(pieces) - len(whole)  # nothing else is held back


def test_the_trigger_still_starts_the_call() -> None:
    row = SmolRow(encode("Sure <tool_call"))
    assert encode(">")[0] in row.allowed()
    row = SmolRow(encode("Sure <tool_call>\n"))
    allowed = row.allowed()
    assert row.batch.rows[0].guide is not None and allowed and encode("{")[0] in allowed
    assert all(row.table.pieces[t].startswith(b"{") for t in allowed)


def test_the_qa_turn_after_a_tool_result_parses_cleanly() -> None:
    """QA finding 2 at the processor: SmolLM2 means to echo the tool-result wrapper (its
    own tokens); under the mask it cannot, and the text it ends with is plain content."""
    intended = [*encode('<tool_response>\n{"temp_c": 12, "sky": "sunny"}\n</tool_response>\nIt is sunny.'), -1]
    out: list[int] = []
    row = SmolRow(out, max_tokens=32)
    eos = row.table.vocabulary.eos_token_id
    gen, cursor = torch.Generator().manual_seed(1), 0
    while len(out) < 32 and eos not in out:
        scores = torch.randn(1, row.width, generator=gen)
        want = intended[cursor] if intended[cursor] >= 0 else eos
        scores[0, want] += 100.0
        token = int(row.logits(scores).argmax())
        out.append(token)
        cursor += token == want
    text = row.text(out).decode(errors="replace")
    assert "<tool_response>" not in text and "</tool_response>" not in text
    assert parse("hermes", text, QA_TOOLS).diagnostics == ()
