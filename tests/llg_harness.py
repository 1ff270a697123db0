"""Test helpers for llguidance grammars: a byte vocabulary, acceptance, random samples.

`byte_vocabulary()`: 256 one-byte tokens and EOS (id 256), the vocabulary under which a
grammar's language is exactly its set of texts. `accepts(grammar, text)`: the grammar admits
the whole text then EOS. `sample(grammar, rng, max_bytes)`: a random text of the grammar
(a random walk over admitted bytes; past `max_bytes // 2` it closes with the budget closer).
"""

from __future__ import annotations

import random
from functools import cache

import llguidance.numpy as lnp
import numpy

from callgate.constraints.llg import LlgVocabulary, check, matcher
from callgate.decoding.closing import closing_plan, format_closers

EOS = 256


@cache
def byte_vocabulary() -> LlgVocabulary:
    return LlgVocabulary.build({bytes([b]): [b] for b in range(256)}, EOS, {EOS: "<eos>"}, 257)


def consume_text(m: object, text: str | bytes) -> int:
    """How many bytes of `text` the byte-vocabulary matcher `m` takes (it stops at the first refused)."""
    data = text.encode() if isinstance(text, str) else text
    done: int = m.try_consume_tokens(list(data))  # type: ignore[attr-defined]
    return done


def accepts(grammar: str, text: str | bytes) -> bool:
    vocab = byte_vocabulary()
    check(grammar, vocab, None)
    m = matcher(grammar, vocab)
    data = text.encode() if isinstance(text, str) else text
    return consume_text(m, data) == len(data) and bool(m.consume_token(EOS))


def allowed_bytes(m: object) -> list[int]:
    mask = lnp.allocate_token_bitmask(1, 257)
    lnp.fill_next_token_bitmask(m, mask, 0)  # type: ignore[arg-type]
    bits = numpy.unpackbits(mask.view(numpy.uint8), bitorder="little")[:257]
    return [int(i) for i in numpy.flatnonzero(bits)]


def sample(grammar: str, rng: random.Random, max_bytes: int = 400, format: str = "") -> str:
    """A random text of `grammar` in `format` (whose markers the closer uses), decoded as
    UTF-8 (the grammar admits only UTF-8)."""
    vocab = byte_vocabulary()
    check(grammar, vocab, None)
    m = matcher(grammar, vocab)
    out = bytearray()
    steps = {b: b for b in range(256)}
    ends = format_closers(format)
    while len(out) < max_bytes // 2:
        choices = allowed_bytes(m)
        if not choices:
            break
        if EOS in choices and (len(choices) == 1 or rng.random() < 0.05):
            return out.decode()
        choices = [c for c in choices if c != EOS]
        b = rng.choice(choices)
        assert m.consume_token(b), m.get_error()
        out.append(b)
    plan = closing_plan(m, steps, EOS, ends, max_bytes=max_bytes)
    assert plan is not None, f"no closing from {bytes(out)!r}"
    return (bytes(out) + plan).decode()
