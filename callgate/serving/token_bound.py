"""A lower bound on a text's token count that needs no tokenising: `TextBound`.

Knows: how much text one token of a Hugging Face `tokenizers` pipeline can cover at most,
read from its serialised config (tokenizer.json): the longest vocabulary entry, and what
the normaliser, pre-tokeniser and model do to the text's length. Does not know: HTTP, engines,
the prompt, any particular model.

Why: a 4 MB prompt takes seconds to tokenise, yet its length alone shows it cannot fit a
context of a few thousand tokens. The bound must never exceed the real count, so a step
that can drop text without a trace (Strip, a precompiled charsmap, a whitespace splitter, a
Removed split, fused unknowns, an added token that eats whitespace) gives no bound at all.

The argument, per pipeline:
* no normaliser: every byte of the text lies in exactly one token (byte-level BPE, byte
  fallback, or one unknown token per character) or is dropped (a byte-level vocabulary
  without it), and a token covers at most `longest` bytes, so tokens >= kept bytes / longest;
* a normaliser: a token covers at most `longest` characters of the normalised text, and
  normalising keeps at least 1/`shrink` of the characters — NFC/NFKC compose at most
  `MAX_DECOMPOSITION` characters into one; Replace(s -> c) shrinks at most len(s)/len(c);
  Lowercase, Prepend and the decompositions never shrink — so tokens >= chars / (shrink * longest).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

MAX_DECOMPOSITION = 4  # the longest canonical decomposition in Unicode (e.g. U+1F82); tested
_UTF8_MAX_BYTES = 4  # an unknown token stands for one character
_KEEPING_PRE_TOKENIZERS = frozenset({"ByteLevel", "Metaspace", "Digits", "UnicodeScripts", "Split", "Punctuation"})


@dataclass(frozen=True, slots=True)
class TextBound:
    """tokens(text) >= ceil(measure(text) / per_token), `measure` counting `unit`s; bytes in
    `dropped` (ones a byte-level vocabulary has no token for, so never tokenised) not counted."""

    unit: Literal["bytes", "chars"]
    per_token: int
    dropped: bytes = b""

    def min_tokens(self, text: str) -> int:
        if self.unit == "chars":
            n = len(text)
        else:
            n = len(text.encode("utf-8", "surrogatepass").translate(None, self.dropped))
        return -(-n // self.per_token)


def text_bound(config: Mapping[str, Any], token_bytes: Callable[[str], bytes]) -> TextBound | None:
    """The bound of the pipeline `config` (tokenizer.json, parsed), or None when it has a step
    that can drop text. `token_bytes(token)` is the text a vocabulary entry stands for."""
    model, added = config.get("model") or {}, config.get("added_tokens") or []
    vocab, pre = model.get("vocab"), _steps(config.get("pre_tokenizer"), "pretokenizers")
    if model.get("type") != "BPE" or not isinstance(vocab, Mapping) or pre is None:
        return None
    if any(a.get("lstrip") or a.get("rstrip") for a in added):
        return None
    if any(s.get("type") not in _KEEPING_PRE_TOKENIZERS or s.get("behavior") == "Removed" for s in pre):
        return None
    longest = max([max(len(token_bytes(t)), len(t)) for t in vocab] + [len(a["content"].encode()) for a in added])
    single = {data[0] for data in map(token_bytes, vocab) if len(data) == 1}
    missing = bytes(b for b in range(256) if b not in single)
    byte_level = any(s.get("type") == "ByteLevel" for s in pre)
    normalizer = config.get("normalizer")
    if byte_level and missing and model.get("unk_token") is None:
        # Byte-level BPE drops a byte it has no token for (SmolLM2 has none for six ASCII
        # controls). Only single-byte characters can vanish whole: counted out, unless
        # a normaliser could produce them or a continuation byte is missing too.
        if normalizer is not None or any(0x80 <= b < 0xC0 for b in missing):
            return None
        return TextBound("bytes", longest, missing)
    if missing or not (byte_level or model.get("byte_fallback")):
        if model.get("unk_token") is None or model.get("fuse_unk"):
            return None  # unknown characters dropped, or runs of them fused into one token
        longest = max(longest, _UTF8_MAX_BYTES)
    if normalizer is None:
        return TextBound("bytes", longest)
    shrink = _shrink(normalizer)
    return None if shrink is None else TextBound("chars", shrink * longest)


def _shrink(normalizer: Mapping[str, Any]) -> int | None:
    """At most how many characters the normaliser turns into one; None when unbounded."""
    steps = _steps(normalizer, "normalizers")
    if steps is None:
        return None
    total = 1
    for step in steps:
        kind = step.get("type")
        if kind in ("NFC", "NFKC"):
            total *= MAX_DECOMPOSITION
        elif kind == "Replace":
            pattern, content = step.get("pattern") or {}, step.get("content") or ""
            if "String" not in pattern or not content:
                return None
            total *= max(1, math.ceil(len(pattern["String"]) / len(content)))
        elif kind not in ("NFD", "NFKD", "Lowercase", "Prepend"):
            return None
    return total


def _steps(step: Mapping[str, Any] | None, nested: str) -> list[Mapping[str, Any]] | None:
    """The leaf steps of a (possibly nested) Sequence; [] for none; None when unreadable."""
    if step is None:
        return []
    if step.get("type") != "Sequence":
        return [step]
    children = step.get(nested)
    if not isinstance(children, list):
        return None
    out: list[Mapping[str, Any]] = []
    for child in children:
        leaves = _steps(child, nested)
        if leaves is None:
            return None
        out += leaves
    return out
