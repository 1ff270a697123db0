"""The token-count lower bound (token_bound.py) never exceeds the real count, through
HfTokenizer, for the pipelines served models use; pipelines that can drop text get none.

Hermetic: tiny BPE tokenizers are trained in the test (byte-level as SmolLM2 / Llama 3,
NFC + byte-level as Qwen, Prepend/Replace + byte fallback as Llama 2 / Mistral, and an
unknown-token one).
"""

from __future__ import annotations

import copy
import json
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from callgate.serving.engines.tokenizer import HfTokenizer
from callgate.serving.token_bound import MAX_DECOMPOSITION, TextBound, text_bound

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
HANGUL = "각낙닥락막박삭악"  # composed syllables; NFD splits each into three jamo
CORPUS = [
    "hello world",
    "the weather in Paris",
    "héllo wörld ✓ naïve café",
    '{"name": "get_weather"}',
    "aaaaaaaaaaaaaaaa    " * 4,
    HANGUL * 4,
] * 20
PIECES = [
    "a", "aaaa", "aaaaaaaaaaaaaaaa", " ", "    ", "\n", "hello", " world", "é", "e\u0301", "ö", "\u0301",
    "\u1100\u1161\u11a8", "\u1100", "\u1161", "\u11a8", "각", "\u03b1\u0313\u0300\u0345", "Ａ", "ﬃ", "K", "Ω",
    "✓", "😀", "<|im_end|>", "<|im_start|>", "<0x41>", "▁", "\x00", "\ud7a3", "\x04", "\U00040000",
]  # fmt: skip
GAPS = "\x04\xf1"  # bytes the "byte-level-gaps" vocabulary lacks, as SmolLM2's lacks some


def train(folder: Path, kind: str) -> HfTokenizer:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    alphabet: list[str] = pre_tokenizers.ByteLevel.alphabet()
    specials = list(SPECIALS)
    if kind == "byte-fallback":
        tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
        specials += ["<unk>", *(f"<0x{b:02X}>" for b in range(256))]
        alphabet = []
    elif kind == "unknown":
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        specials.append("<unk>")
        alphabet = []
    else:
        tok = Tokenizer(models.BPE())
        if kind == "byte-level-gaps":
            alphabet = [c for c, b in zip(alphabet, _alphabet_bytes(alphabet), strict=True) if chr(b) not in GAPS]
        if kind == "nfc":
            tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=specials, initial_alphabet=alphabet)
    tok.train_from_iterator(CORPUS, trainer)
    factory: Any = PreTrainedTokenizerFast  # untyped constructor
    fast = factory(tokenizer_object=tok, eos_token="<|im_end|>", bos_token="<|im_start|>")
    fast.save_pretrained(folder)
    return HfTokenizer(folder)


def _alphabet_bytes(alphabet: list[str]) -> list[int]:
    from callgate.serving.engines.tokenizer import _unicode_to_byte

    table = _unicode_to_byte()
    return [table[c] for c in alphabet]


KINDS = ("byte-level", "byte-level-gaps", "nfc", "byte-fallback", "unknown")


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, HfTokenizer]:
    return {kind: train(tmp_path_factory.mktemp(kind), kind) for kind in KINDS}


def config(tok: HfTokenizer) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(tok.hf.backend_tokenizer.to_str())
    return loaded


@given(
    parts=st.lists(st.sampled_from(PIECES), max_size=60),
    spans=st.lists(st.tuples(st.integers(0, 200), st.integers(0, 200)), max_size=3),
)
@settings(max_examples=150, deadline=None)
@pytest.mark.parametrize("kind", KINDS)
def test_bound_never_exceeds_the_count(
    tokenizers: dict[str, HfTokenizer], kind: str, parts: list[str], spans: list[tuple[int, int]]
) -> None:
    tok, text = tokenizers[kind], "".join(parts)
    assert tok.min_tokens(text) <= len(tok.encode(text, tuple(spans)))
    assert tok.min_tokens(text) <= len(tok.encode(text))


@pytest.mark.parametrize("kind", KINDS)
def test_every_served_kind_of_pipeline_has_a_bound(tokenizers: dict[str, HfTokenizer], kind: str) -> None:
    tok = tokenizers[kind]
    assert tok.min_tokens("") == 0
    assert 0 < tok.min_tokens("a" * 5000) <= len(tok.encode("a" * 5000))


def test_a_normaliser_that_shrinks_text_weakens_the_bound(tokenizers: dict[str, HfTokenizer]) -> None:
    """NFC turns three jamo (9 bytes) into one syllable (3): counting bytes would overshoot."""
    tok = tokenizers["nfc"]
    jamo = unicodedata.normalize("NFD", HANGUL * 40)
    bound = text_bound(config(tok), tok.token_bytes)
    assert bound is not None and bound.unit == "chars"
    n = len(tok.encode(jamo))
    assert tok.min_tokens(jamo) <= n < TextBound("bytes", bound.per_token // MAX_DECOMPOSITION).min_tokens(jamo)


def test_the_bound_is_the_longest_token(tokenizers: dict[str, HfTokenizer]) -> None:
    tok = tokenizers["byte-level"]
    longest = max(len(tok.token_bytes(t)) for t in tok.hf.get_vocab())
    assert text_bound(config(tok), tok.token_bytes) == TextBound("bytes", longest)
    assert tok.min_tokens("é" * longest) == 2  # bytes, not characters


DROPPING: dict[str, Callable[[dict[str, Any]], Any]] = {
    "strip": lambda c: c.update(normalizer={"type": "Strip", "strip_left": True, "strip_right": True}),
    "precompiled charsmap": lambda c: c.update(normalizer={"type": "Precompiled", "precompiled_charsmap": ""}),
    "regex replace": lambda c: c.update(normalizer={"type": "Replace", "pattern": {"Regex": " +"}, "content": " "}),
    "replace with nothing": lambda c: c.update(
        normalizer={"type": "Replace", "pattern": {"String": " "}, "content": ""}
    ),
    "nested unknown step": lambda c: c.update(
        normalizer={"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "StripAccents"}]}
    ),
    "whitespace split": lambda c: c.update(pre_tokenizer={"type": "Whitespace"}),
    "removed split": lambda c: c.update(
        pre_tokenizer={
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"String": " "}, "behavior": "Removed", "invert": False},
                c["pre_tokenizer"],
            ],
        }
    ),
    "unreadable sequence": lambda c: c.update(pre_tokenizer={"type": "Sequence", "steps": []}),
    "added token eating whitespace": lambda c: c["added_tokens"][0].update(rstrip=True),
    "not BPE": lambda c: c["model"].update(type="WordPiece"),
    "continuation byte dropped": lambda c: c["model"].update(
        vocab={t: i for t, i in c["model"]["vocab"].items() if _alphabet_bytes([t[0]]) != [0x80] or len(t) > 1}
    ),
}


@pytest.mark.parametrize("name", DROPPING)
def test_a_step_that_can_drop_text_gives_no_bound(tokenizers: dict[str, HfTokenizer], name: str) -> None:
    tok = tokenizers["byte-level"]
    cfg = copy.deepcopy(config(tok))
    assert text_bound(cfg, tok.token_bytes) is not None
    DROPPING[name](cfg)
    assert text_bound(cfg, tok.token_bytes) is None


def test_bytes_a_byte_level_vocabulary_lacks_are_dropped_and_not_counted(
    tokenizers: dict[str, HfTokenizer],
) -> None:
    tok = tokenizers["byte-level-gaps"]
    assert tok.encode("\x04" * 500) == [] and tok.min_tokens("\x04" * 500) == 0
    text = "\U00040000" * 500  # lead byte 0xF1 dropped, its three continuation bytes kept
    bound = text_bound(config(tok), tok.token_bytes)
    assert bound is not None and bound.dropped == GAPS.encode("latin-1")
    assert tok.min_tokens(text) == -(-1500 // bound.per_token)
    assert 0 < tok.min_tokens(text) <= len(tok.encode(text))
    cfg = config(tok)
    cfg["normalizer"] = {"type": "NFC"}  # it might produce such bytes: no bound
    assert text_bound(cfg, tok.token_bytes) is None


def test_fused_unknowns_give_no_bound(tokenizers: dict[str, HfTokenizer]) -> None:
    tok = tokenizers["unknown"]
    cfg = copy.deepcopy(config(tok))
    cfg["model"]["fuse_unk"] = True
    assert text_bound(cfg, tok.token_bytes) is None


def test_shrinking_replace_and_composition_scale_the_bound(tokenizers: dict[str, HfTokenizer]) -> None:
    tok = tokenizers["byte-level"]
    base = text_bound(config(tok), tok.token_bytes)
    assert base is not None and base.unit == "bytes"
    cfg = config(tok)
    cfg["normalizer"] = {
        "type": "Sequence",
        "normalizers": [
            {"type": "NFKC"},
            {"type": "Replace", "pattern": {"String": "   "}, "content": " "},
            {"type": "Lowercase"},
        ],
    }
    assert text_bound(cfg, tok.token_bytes) == TextBound("chars", base.per_token * MAX_DECOMPOSITION * 3)


def test_max_decomposition_is_unicodes() -> None:
    longest = max(len(unicodedata.normalize("NFD", chr(c))) for c in range(0x110000) if not 0xD800 <= c < 0xE000)
    assert longest == MAX_DECOMPOSITION
