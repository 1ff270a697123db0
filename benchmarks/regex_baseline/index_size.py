"""How large an Index would be, known before it is built, and the refusal of one too large.

Knows: outlines-core's Index over a vocabulary of the 256 single bytes, whose states are the
grammar's byte states; an Index over a real vocabulary has at most those states, each with
at most one transition per token. Does not know: requests, formats, the cache.

Measured on this machine (2 cores) for a hermes `required` tool whose object has n optional
string properties, over SmolLM2's 49k tokens:

    n    byte states   byte pass   real Index    serialised
    1          268       0.006 s      0.16 s        21 MB
    15        7780       0.53 s       2.8 s        165 MB
    45       67639       4.2 s    (~25 s, GBs: what QA saw)

The byte pass costs about a fifth of the real compile and a little memory (states x 256
bytes at most), so paying it first bounds the real compile: no Index over `max_cells`
(states x vocabulary size) is ever built, and so no compile that overran its time limit can
go on for long or grow memory much past that bound.
"""

from __future__ import annotations

import threading

import outlines_core

from callgate.errors import SchemaTooComplexError

from .cache import TokenVocabulary, token_vocabulary

# 20 000 byte states on a 49k vocabulary (the bound closing tables use, automaton.py):
# about 7 s and some hundreds of MB of Index on this machine, past the default time limit.
MAX_INDEX_CELLS = 1_000_000_000
# A whole grammar's regex: the byte pass takes ~11 us a character here (333 KB: 3.6 s)
MAX_GRAMMAR_CHARS = 1 << 20

_BYTES: list[TokenVocabulary] = []
_LOCK = threading.Lock()


def byte_vocabulary() -> TokenVocabulary:
    """The 256 single bytes, one token each (built once)."""
    with _LOCK:
        if not _BYTES:
            _BYTES.append(token_vocabulary({bytes([b]): [b] for b in range(256)}, eos_token_id=256))
        return _BYTES[0]


def byte_states(regex: str) -> int:
    """The number of states of `regex`'s byte automaton reachable from its start."""
    index = outlines_core.Index(regex, byte_vocabulary().inner)
    return len(set(index.get_transitions()) | set(index.get_final_states()))


def check_size(regex: str, vocabulary: TokenVocabulary, param: str, max_cells: int | None = None) -> None:
    """Raise SchemaTooComplexError (400) naming `param` when the Index of `regex` over
    `vocabulary` could hold more than `max_cells` (default MAX_INDEX_CELLS) transitions."""
    max_cells = MAX_INDEX_CELLS if max_cells is None else max_cells
    if len(regex) > MAX_GRAMMAR_CHARS:  # its byte pass alone would take many seconds
        raise SchemaTooComplexError(
            f"the tool/response schemas make a grammar of {len(regex)} characters, too large to compile "
            f"(at most {MAX_GRAMMAR_CHARS}); simplify them",
            param=param,
        )
    states = byte_states(regex)
    if states * vocabulary.size > max_cells:
        raise SchemaTooComplexError(
            f"the tool/response schemas make a grammar of {states} states, too large to compile over "
            f"a {vocabulary.size}-token vocabulary (at most {max_cells // max(vocabulary.size, 1)}); simplify them",
            param=param,
        )
