"""callgate.constraints.lark_text.without: free text that holds no marker, written without `~`.

Every format's real marker sets (what lark_grammar, lark_qwen3_values and lark_dsml pass) and
a few overlapping shapes are checked against a plain Python reading on texts built from the
markers' own pieces, each through a real llguidance matcher over a byte vocabulary; and the
mask inside such text is the one slice llguidance admits whole.
"""

from __future__ import annotations

import random

import pytest

from callgate.constraints.lark_text import _kept_out, avoiding, without
from tests.llg_harness import accepts

QWEN3_VALUE = ["\n</parameter>", "\n<parameter=", "</function>", "</tool_call>", "<tool_call>", "<|im_end|>"]
HERMES_CONTENT = ["</think>", "</tool_call>", "<think>", "<tool_call>", "<|endoftext|>", "<|im_end|>", "<|im_start|>"]
DSML_CONTENT = ["\n\n<｜DSML｜tool_calls>", "</think>", "<think>", "｜"]
LLAMA_CONTENT = ["<|eot_id|>", "<|python_tag|>", '{"name":']
MISTRAL_CONTENT = ["</s>", "[TOOL_CALLS]", "[INST]", "[/INST]", "<unk>"]
SHAPES = [["aab"], ["abab", "bab"], ["ab", "b"], ["x<", "<ab"]]
SETS = [QWEN3_VALUE, HERMES_CONTENT, DSML_CONTENT, LLAMA_CONTENT, MISTRAL_CONTENT, *SHAPES]


def texts(words: list[str], n: int, seed: int) -> list[str]:
    """Texts glued from the words, their prefixes and suffixes, and a few other characters."""
    rng = random.Random(seed)
    pieces = [*words, *(w[:k] for w in words for k in range(1, len(w)))]
    pieces += [w[k:] for w in words for k in range(1, len(w))] + list("ab<>/\n|x ")
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 6))) for _ in range(n)]


@pytest.mark.parametrize("words", SETS, ids=[repr(w[0])[:12] for w in SETS])
def test_the_text_terminal_holds_exactly_the_texts_without_the_kept_out_markers(words: list[str]) -> None:
    body = without(words)
    assert "~" not in body  # every set here has a negation-free form
    grammar = f"%llguidance {{}}\nstart: T\nT: {body}\n"
    kept_out = _kept_out(words)
    assert all(any(k in w for w in words) for k in kept_out)  # a marker's own tail, never more
    for text in texts(words, 150, seed=len(body)):
        want = not any(k in text for k in kept_out)
        assert accepts(grammar, text) == want, (words, text)


def test_a_marker_is_cut_only_where_another_marker_begins_inside_it() -> None:
    assert _kept_out(QWEN3_VALUE) == [
        "<|im_end|>",
        "</function>",
        "<parameter=",
        "<tool_call>",
        "</parameter>",
        "</tool_call>",
    ]
    assert _kept_out(DSML_CONTENT) == ["｜", "<think>", "</think>"]  # the block's opener holds the bar
    assert _kept_out(["aab"]) == ["aab"]  # a tail shorter than _TAIL would keep out too much


def test_the_general_construction_agrees_where_markers_overlap() -> None:
    for words in (["aab"], ["abab", "bab"], ["\n</a>", "<b>"]):
        rx = avoiding(words)
        assert rx is not None
        grammar = f"%llguidance {{}}\nstart: /{rx}/\n"
        for text in texts(words, 150, seed=1):
            assert accepts(grammar, text) == (not any(w in text for w in words)), (words, text)
