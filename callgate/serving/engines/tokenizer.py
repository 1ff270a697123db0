"""The served model's tokenizer, loaded from a local folder, as the `Tokenizer` role.

Knows: how callgate tokenises its rendered prompt — no BOS/EOS added; special-token text
(`<|im_start|>` ...) is a special token in callgate's own structure, but ordinary text
inside untrusted spans (user and tool content), so content cannot forge a turn; how to
find those spans; the byte-exact vocabulary outlines-core needs; and a token-count lower
bound that needs no tokenising (token_bound.py). Does not know: vllm, HTTP, any hub
(`local_files_only`).

Tokenising per segment means BPE merges never cross a span boundary. That is deliberate:
a boundary is a trust boundary, and the split is deterministic, so prefix caching still
sees identical ids for identical prompts.

`encode` is safe to call from several threads: transformers switches special-token matching
on the shared Rust tokenizer (`encode_special_tokens`) before each call, so segments of two
concurrent calls could otherwise be read with each other's setting — content forging a turn.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from callgate.serving.token_bound import TextBound, text_bound

Spans = tuple[tuple[int, int], ...]


def content_spans(prompt: str, contents: Sequence[str]) -> Spans:
    """[start, end) spans of `contents`, found in order, each after the previous one.

    For the chat service: the message contents it rendered, located in the rendered prompt.
    A content that cannot be found (the renderer rewrote it) is skipped.
    """
    spans: list[tuple[int, int]] = []
    pos = 0
    for text in contents:
        if not text:
            continue
        start = prompt.find(text, pos)
        if start < 0:
            continue
        spans.append((start, start + len(text)))
        pos = start + len(text)
    return tuple(spans)


def segments(text: str, untrusted_spans: Spans) -> list[tuple[str, bool]]:
    """`text` cut into (piece, trusted) segments; overlapping or out-of-range spans are clipped."""
    out: list[tuple[str, bool]] = []
    pos = 0
    for start, end in sorted(untrusted_spans):
        start, end = max(start, pos), min(end, len(text))
        if start >= end:
            continue
        if start > pos:
            out.append((text[pos:start], True))
        out.append((text[start:end], False))
        pos = end
    if pos < len(text):
        out.append((text[pos:], True))
    return out


class HfTokenizer:
    """A transformers tokenizer from a local folder, behind callgate's `Tokenizer` role."""

    def __init__(self, folder: str | Path) -> None:
        from transformers import AutoTokenizer

        self._tok: Any = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        self._special_ids = frozenset(
            int(i) for i, added in self._tok.added_tokens_decoder.items() if getattr(added, "special", False)
        ) | frozenset(self._tok.all_special_ids)
        self._vocab: dict[bytes, list[int]] | None = None
        self._encoding = threading.Lock()
        backend = getattr(self._tok, "backend_tokenizer", None)  # None: a slow (python) tokenizer
        self._bound: TextBound | None = (
            None if backend is None else text_bound(json.loads(backend.to_str()), self.token_bytes)
        )

    @property
    def hf(self) -> Any:
        """The wrapped transformers tokenizer (for vLLM, which wants one)."""
        return self._tok

    @property
    def eos_token_id(self) -> int:
        return int(self._tok.eos_token_id)

    @property
    def vocab_size(self) -> int:
        return len(self._tok)

    def encode(self, text: str, untrusted_spans: Spans = ()) -> list[int]:
        ids: list[int] = []
        with self._encoding:
            for piece, trusted in segments(text, untrusted_spans):
                ids += self._tok(piece, add_special_tokens=False, split_special_tokens=not trusted)["input_ids"]
        return ids

    def min_tokens(self, text: str) -> int:
        return 0 if self._bound is None else self._bound.min_tokens(text)

    def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=False))

    def vocabulary(self) -> dict[bytes, list[int]]:
        if self._vocab is None:
            self._vocab = self._build_vocabulary()
        return {data: list(ids) for data, ids in self._vocab.items()}

    def _build_vocabulary(self) -> dict[bytes, list[int]]:
        vocab: dict[bytes, list[int]] = {}
        for token, token_id in self._tok.get_vocab().items():
            if token_id in self._special_ids or token_id == self.eos_token_id:
                continue
            data = self.token_bytes(token)
            if data:
                vocab.setdefault(data, []).append(int(token_id))
        return vocab

    @property
    def chat_template(self) -> str | None:
        """The model's own chat template (tokenizer_config.json or chat_template.jinja)."""
        template = getattr(self._tok, "chat_template", None)
        return template if isinstance(template, str) else None

    def special_tokens(self) -> dict[int, str]:
        """The texts of the added tokens (special or not: llguidance reads each as one
        token), by id."""
        return {int(i): str(t.content) for i, t in self._tok.added_tokens_decoder.items()}

    def token_bytes(self, token: str) -> bytes:
        """The bytes a vocabulary entry stands for (byte-level BPE or sentencepiece)."""
        if _byte_level(self._tok):
            table = _unicode_to_byte()
            if all(c in table for c in token):
                return bytes(table[c] for c in token)
        if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
            return bytes([int(token[3:5], 16)])
        return token.replace("\u2581", " ").encode("utf-8")


def special_tokens(tokenizer: Any) -> dict[int, str]:
    """A Tokenizer's special-token texts by id; {} for one that names none (tests' fakes)."""
    found = getattr(tokenizer, "special_tokens", None)
    return dict(found()) if callable(found) else {}


def writes_reasoning(tokenizer: Any, opening: str | None) -> bool:
    """Whether a model writes a reasoning block opened by `opening`, as its chat template
    says (the tag appears in it); True when the tokenizer has no template to read."""
    if opening is None:
        return False
    template = getattr(tokenizer, "chat_template", None)
    return not isinstance(template, str) or opening in template


def _byte_level(tok: Any) -> bool:
    backend = getattr(tok, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    return type(decoder).__name__ == "ByteLevel" or "ByteLevel" in repr(decoder)


@cache
def _unicode_to_byte() -> dict[str, int]:
    """GPT-2's reversible byte <-> printable-unicode table, inverted."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table: dict[str, int] = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table
