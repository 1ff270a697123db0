"""callgate.constraints.llg.LlgVocabulary: the encoder llguidance re-tokenises forced text with.

llguidance spells the bytes a grammar forces with the encoder it was built with; callgate's
is a greedy longest-match, run by the built tokenizer's own trie once it exists. Checked on
the real Qwen2.5 vocabulary (151 936 ids) against the plain greedy loop it replaces.
"""

from __future__ import annotations

import random

import pytest

from callgate.constraints.llg import LlgVocabulary, _Tokens
from tests.test_lark_dsml import QWEN

TEXTS = [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="x" string="true">',
    "<tool_call>\n<function=search>\n<parameter=query>\nnaïve café — 東京\n</parameter>\n</function>",
    "    def f(x):\n        return x  # comment\n\n\n",
    "",
]


@pytest.fixture(scope="module")
def qwen() -> LlgVocabulary:
    from callgate.serving.engines.tokenizer import HfTokenizer

    tok = HfTokenizer(QWEN)
    return LlgVocabulary.build(tok.vocabulary(), tok.eos_token_id, tok.special_tokens(), tok.vocab_size)


def slow(vocab: LlgVocabulary) -> _Tokens:
    """The greedy loop alone (no trie): the reference."""
    tokens = [
        vocab.tokenizer.decode_bytes([i]) if not vocab.tokenizer.is_special_token(i) else b"\xff"
        for i in range(vocab.size)
    ]
    return _Tokens(tokens, vocab.eos_token_id, [])


def test_forced_text_is_spelled_as_the_greedy_loop_spells_it(qwen: LlgVocabulary) -> None:
    reference = slow(qwen)
    rng = random.Random(0)
    texts = [*TEXTS]
    for text in TEXTS[:3]:  # and fragments cut anywhere in a character's bytes
        data = text.encode()
        texts += [data[rng.randrange(len(data)) :][: rng.randrange(1, 40)] for _ in range(30)]
    for text in texts:
        data = text.encode() if isinstance(text, str) else text
        assert qwen.greedy(data) == reference(data), data
        assert qwen.tokenizer.decode_bytes(qwen.greedy(data)) == data


def test_llguidance_spells_text_with_the_same_greedy_ids(qwen: LlgVocabulary) -> None:
    text = TEXTS[1]
    assert qwen.tokenizer.tokenize_str(text) == qwen.tokenizer.greedy_tokenize(text) == slow(qwen)(text)
