"""Budget closing: a short way from a matcher's state to the end of the grammar.

Knows: llguidance's matcher (consume, rollback, is_accepting, masks, forced bytes) and a
vocabulary's single-byte tokens. Does not know: formats (callers pass the texts that close their structures), HTTP.

    plan = closing_plan(matcher, steps, closers)   # bytes that end the grammar, or None

The planner walks forward from the matcher's state one byte at a time, then rolls every byte
back, so the matcher is left as it was. At each byte it takes, in order: the end of the
grammar (EOS allowed: done); the bytes the grammar forces from here (llguidance's
`compute_ff_bytes`, one call for a key name's rest or a marker's, unless a closer goes on
past them); of `closers` (format markers such as `\n</tool_call>`, a JSON
string's `"`, `}` and `]`) the one admitted whole after which the grammar admits the fewest
bytes, if that is few (it ended a free-text state); else the first admitted byte of
`_PREFERENCE` (a value's shortest spellings first: `"` `0` `[` `{` `t` `f` `n`, then
letters, which complete a required key or an enum). It is greedy, not a
shortest-path search: its plan is a bound on what closing costs, short for the outputs the
formats write (a few tokens per open string or container, plus each required key still
missing with its shortest value), and never longer than `max_bytes` (None past that: the
budget cannot close this row).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy

from callgate.formats import FORMATS

# the markers that end what a model writes (not the prompt's: those are free text there)
_CLOSING_KEYS = frozenset(
    {"block_close", "invoke_close", "param_close", "tag_end", "call_close", "function_close", "parameter_close"}
)
# of those, the ones that close a parameter's raw value (the model's text up to them is the value)
VALUE_CLOSING_KEYS = frozenset({"param_close", "parameter_close"})
_PREFERENCE = b'"}]0[{tfn\n>,:-1 abcdefghijklmnopqrstuvwxyz_ABCDEFGHIJKLMNOPQRSTUVWXYZ23456789./<=()'
_PREFERENCE += bytes(range(0x80, 0xC0))  # a character cut inside its UTF-8 bytes is finished first
# last: a multi-byte character's lead byte, where a marker needs one (DSML's U+FF5C bars:
# after `<` of a required parameter's tag only 0xEF is admitted)
_PREFERENCE += bytes(range(0xC2, 0xF5))
_NARROW = 32
_REPEATS = 16
JSON_CLOSERS = ('"', "}", "]", '"}', "}}", "]}", '"]')


def closing_plan(
    matcher: Any,
    steps: Mapping[int, int],
    eos_token_id: int,
    closers: Sequence[bytes] = (),
    *,
    max_bytes: int = 512,
) -> bytes | None:
    """Bytes after which the grammar accepts (EOS then ends it); b"" when it accepts now.
    `matcher` is over a vocabulary whose one-byte tokens are `steps` (byte value -> id);
    a byte vocabulary (tests' and the processor's twin) keeps each mask cheap."""
    taken = 0
    out = bytearray()
    ordered = sorted(set(closers), key=len)
    last, run, avoid = b"", 0, b""
    width = max([eos_token_id, *steps.values()]) + 1
    mask = numpy.zeros(((width + 31) // 32,), dtype=numpy.int32)
    try:
        while True:
            if matcher.is_accepting():
                return bytes(out)
            if matcher.is_error() or len(out) >= max_bytes:
                return None
            # bytes the grammar admits alone, in one call; else one mask that closers and bytes read
            piece: bytes | None = _forced(matcher, steps, ordered)
            if not piece:
                admitted = _mask(matcher, mask)
                piece = _closer(matcher, steps, ordered, mask, admitted) or _byte(matcher, steps, admitted, avoid)
            if piece is None:
                return None
            # a byte taken again and again keeps a value open (`^a+b$` under `a`): avoid it once
            run = run + 1 if piece == last else 1
            last = piece
            avoid = piece if run > _REPEATS and len(piece) == 1 else b""
            out += piece
            taken += len(piece)
    finally:
        if taken:
            matcher.rollback(taken)


def _forced(matcher: Any, steps: Mapping[int, int], closers: Sequence[bytes]) -> bytes:
    """The bytes every way on from here begins with, taken (b"" when there is a choice, or
    when a closer goes on past them: the closer is weighed as a whole, by `_closer`)."""
    data = bytes(matcher.compute_ff_bytes())
    ids = [steps.get(b) for b in data]
    if not data or None in ids or any(len(c) > len(data) and c.startswith(data) for c in closers):
        return b""
    done = matcher.try_consume_tokens(ids)
    return bytes(data[:done])


def _mask(matcher: Any, mask: numpy.ndarray) -> int:
    """The matcher's mask as an int (bit i: token i admitted)."""
    matcher.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
    return int.from_bytes(mask.tobytes(), "little")


def _closer(
    matcher: Any, steps: Mapping[int, int], closers: Sequence[bytes], mask: numpy.ndarray, admitted: int
) -> bytes | None:
    """The admitted closer after which the fewest bytes are admitted: a closer that ends a
    free-text state (a string's `"`, `</think>`) leaves few, one that is only text there
    leaves them all. None when none narrows the grammar to at most `_NARROW` bytes."""
    best: tuple[int, int, bytes] | None = None
    for text in closers:
        ids = [steps.get(b) for b in text]
        if None in ids or not admitted >> ids[0] & 1:  # type: ignore[operator]
            continue
        if matcher.validate_tokens(ids) < len(ids):  # asked without moving the matcher: cheap
            continue
        matcher.try_consume_tokens(ids)
        n = 0 if matcher.is_accepting() else _mask(matcher, mask).bit_count()
        if best is None or (n, len(text)) < best[:2]:
            best = (n, len(text), text)
        matcher.rollback(len(ids))
    if best is None or best[0] > _NARROW:
        return None
    matcher.try_consume_tokens([steps[b] for b in best[2]])
    return best[2]


def _byte(matcher: Any, steps: Mapping[int, int], admitted: int, avoid: bytes = b"") -> bytes | None:
    for b in _PREFERENCE:
        if avoid and b == avoid[0]:
            continue
        token = steps.get(b)
        if token is not None and admitted >> token & 1 and matcher.try_consume_tokens([token]) == 1:
            return bytes([b])
    return None


@functools.cache
def format_closers(format: str) -> tuple[bytes, ...]:
    """The texts that close structures of `format`: JSON's, and the format's closing markers
    and reasoning close (with and without a newline before them); an unknown format (quick
    heads' keys) gets JSON's."""
    fmt = FORMATS.get(format)
    texts = set(JSON_CLOSERS)
    if fmt is not None:
        marks = [v for k, v in fmt.markers.named_texts() if k in _CLOSING_KEYS]
        marks += [fmt.reasoning_close] if fmt.reasoning_close else []
        # a call's own opening marker (not llama3-json's `{"name": `, which opens free JSON):
        # from a grammar's start it beats an empty reasoning block the letters would spell
        if fmt.call_trigger.lstrip()[:1] in ("<", "["):
            marks.append(fmt.call_trigger)
        texts |= {p + m for m in marks for p in ("", "\n")}
    return tuple(t.encode() for t in texts)


def single_byte_tokens(by_bytes: Mapping[bytes, Sequence[int]]) -> dict[int, int]:
    """byte value -> token id, for the vocabulary's one-byte tokens."""
    return {data[0]: ids[0] for data, ids in by_bytes.items() if len(data) == 1 and ids}
