"""llguidance's side of a grammar: the vocabulary it reads and the check of a grammar text.

Knows: how an engine's tokens (ordinary token bytes, special-token texts, EOS) become an
`llguidance.LLTokenizer` (a special token is its text behind a 0xFF byte, so no regex ever
produces one), and how llguidance reports a grammar it cannot build. Does not know:
formats, requests, or decoding steps.

    LlgVocabulary.build(ordinary, eos_token_id, specials, size) -> LlgVocabulary
    check(grammar_text, vocabulary, param) -> None        # raises SchemaTooComplexError
    matcher(grammar_text, vocabulary) -> llguidance.LLMatcher

A grammar compiles lazily: building a matcher parses the Lark text and the embedded JSON
schemas (milliseconds for a dozen tools); lexer states and masks are computed when a step
first needs them, over a token trie, so no step enumerates the vocabulary per state.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import llguidance

from callgate.errors import SchemaTooComplexError

# Bounds on one grammar's work (llguidance's defaults): a schema whose lexer or Earley
# items would pass them is an error state, never a stuck step.
LIMITS = llguidance.LLParserLimits()
# The token slices llguidance's mask admits whole where the lexer state's language holds the
# slice's regex (that part of the trie is not walked): llguidance's JSON-string slices, and
# text with no `<` nor DSML's bar, the inside of a raw value or of free text, whose markers
# all hold one of them (lark_text.without). A raw value's mask on 49k ids: ~330 us -> ~5 us.
SLICES = [*llguidance.LLTokenizer.general_slices(), "[^<｜]+"]


class _Tokens:
    """The `gtokenizer` llguidance's TokenizerWrapper reads: token bytes by id and a greedy
    encoder (used only for text the grammar forces, which llguidance re-tokenises: every
    forced token a step takes). Once the LLTokenizer exists the encoder is its own greedy
    tokenizer over its token trie (`fast`: 33 against 240 us for 260 bytes of DSML markup,
    the same ids), this loop only for text that is not UTF-8."""

    def __init__(self, tokens: list[bytes], eos_token_id: int, special_ids: list[int]) -> None:
        self.tokens = tokens
        self.eos_token_id = eos_token_id
        self.bos_token_id = None
        self.special_token_ids = special_ids
        self._by_bytes = {t: i for i, t in enumerate(tokens) if t and not t.startswith(b"\xff")}
        self._longest = max((len(t) for t in self._by_bytes), default=1)
        self.fast: Any = None  # str -> ids: the built LLTokenizer's greedy_tokenize

    def __call__(self, text: bytes | str) -> list[int]:
        if self.fast is not None:
            try:
                return list(self.fast(text if isinstance(text, str) else text.decode()))
            except UnicodeDecodeError:
                pass
        data = text.encode() if isinstance(text, str) else text
        out: list[int] = []
        pos = 0
        while pos < len(data):
            for size in range(min(self._longest, len(data) - pos), 0, -1):
                found = self._by_bytes.get(data[pos : pos + size])
                if found is not None:
                    out.append(found)
                    pos += size
                    break
            else:
                raise ValueError(f"no token for byte {data[pos]:#x}")
        return out


@dataclass(frozen=True, slots=True, eq=False)
class LlgVocabulary:
    """A vocabulary as llguidance reads it. `specials`: its special tokens but EOS, text ->
    id (a grammar writes a marker that is one as `<[id]>`); `fingerprint` names it in keys."""

    tokenizer: Any  # llguidance.LLTokenizer
    eos_token_id: int
    size: int
    specials: Mapping[str, int]
    fingerprint: str
    by_bytes: Mapping[bytes, Sequence[int]] = field(repr=False, default_factory=dict)

    @classmethod
    def build(
        cls,
        ordinary: Mapping[bytes, Sequence[int]],
        eos_token_id: int,
        specials: Mapping[int, str] | None = None,
        size: int | None = None,
    ) -> LlgVocabulary:
        """From `Tokenizer.vocabulary()` (token bytes -> ids, EOS and specials left out), the
        EOS id, special-token texts by id, and the logits' width (ids without a token are
        special tokens no grammar names)."""
        specials = dict(specials or {})
        top = max([eos_token_id, *specials, *(i for ids in ordinary.values() for i in ids)], default=0)
        width = max(size or 0, top + 1)
        tokens: list[bytes] = [b""] * width
        for data, ids in ordinary.items():
            for i in ids:
                tokens[i] = data
        specials.setdefault(eos_token_id, specials.get(eos_token_id, "<|eos|>"))
        for i, text in specials.items():
            tokens[i] = b"\xff" + text.encode()
        for i, data in enumerate(tokens):
            if not data:
                tokens[i] = b"\xff" + f"<[unused {i}]>".encode()
        special_ids = sorted(i for i, t in enumerate(tokens) if t.startswith(b"\xff"))
        encoder = _Tokens(tokens, eos_token_id, special_ids)
        tokenizer = llguidance.LLTokenizer(
            llguidance.TokenizerWrapper(encoder), n_vocab=width, eos_token=eos_token_id, slices=SLICES
        )
        encoder.fast = tokenizer.greedy_tokenize
        digest = hashlib.sha256(b"\0".join(tokens) + str(eos_token_id).encode()).hexdigest()[:16]
        texts = {text: i for i, text in specials.items() if i != eos_token_id}
        return cls(tokenizer, eos_token_id, width, texts, digest, {d: tuple(ids) for d, ids in ordinary.items()})

    def greedy(self, data: bytes) -> list[int]:
        """`data` in the longest tokens, left to right: what llguidance spells forced text with."""
        return list(self.tokenizer.tokenize_bytes(data))


def check(grammar_text: str, vocabulary: LlgVocabulary | None, param: str | None) -> None:
    """Raise SchemaTooComplexError (400) when llguidance cannot build the grammar."""
    error = llguidance.LLMatcher.validate_grammar(grammar_text, vocabulary.tokenizer if vocabulary else None)
    if error:
        first = error.strip().splitlines()[0]
        raise SchemaTooComplexError(f"the schemas make a grammar that cannot be built: {first}", param=param)


def matcher(grammar_text: str, vocabulary: LlgVocabulary) -> Any:
    """A fresh matcher (check the grammar first: a bad one is a matcher in its error state)."""
    return llguidance.LLMatcher(vocabulary.tokenizer, grammar_text, log_level=0, limits=LIMITS)
