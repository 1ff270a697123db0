"""Budget closing's tables on disk, beside the Index file they belong to.

Knows: cache.py's framed files and companion suffixes, automaton.py's arrays, and which
vocabularies it has spelled. Does not know: requests, vLLM, masks.

The server compiles each grammar (in a worker thread, off the event loop) and writes its
Index for the engine process; `persist` then also writes the grammar's byte automaton and
distances (5-40 ms to build for BFCL grammars on SmolLM2) to `<same name>.closing`, so the
engine's budget closing loads them (about a millisecond) instead of building them inside
a decoding step. `load` returns None for a missing or damaged file (logged); the engine
then builds the tables itself.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from callgate.constraints.automaton import (
    ByteAutomaton,
    Spelling,
    automaton_bytes,
    automaton_from_bytes,
    build_automaton,
)
from callgate.constraints.cache import CLOSING_SUFFIX, TokenVocabulary, read_framed, touch, write_framed

log = logging.getLogger("callgate.constraints.closing_store")

MAGIC = b"callgate-closing/2\n"  # /2: with `reach`; a /1 file is rebuilt

_SPELLINGS: dict[str, Spelling | None] = {}  # vocabulary fingerprint -> its spelling (None: not every byte)
_LOCK = threading.Lock()


def path_for(index_path: str | Path) -> Path:
    """The closing file beside an Index file."""
    return Path(index_path).with_suffix(CLOSING_SUFFIX)


def spelling_of(vocabulary: TokenVocabulary) -> Spelling | None:
    """The vocabulary's Spelling (built once per vocabulary), None when some token uses a
    byte without a one-byte token or the vocabulary was built without its tokens."""
    with _LOCK:
        if vocabulary.fingerprint not in _SPELLINGS:
            found = Spelling.usable(vocabulary.tokens) if vocabulary.tokens else None
            _SPELLINGS[vocabulary.fingerprint] = found
        return _SPELLINGS[vocabulary.fingerprint]


def persist(index_path: str | Path, index: Any, vocabulary: TokenVocabulary) -> Path | None:
    """Write the closing tables of `index` beside its file unless they are there already.
    Returns the path, None when nothing could be written (logged; the engine builds them)."""
    target = path_for(index_path)
    if _current(target) and touch(target):
        return target
    spelling = spelling_of(vocabulary)
    if spelling is None:
        return None
    try:
        write_framed(target, MAGIC, automaton_bytes(build_automaton(index, spelling)))
    except (LookupError, OSError) as exc:
        log.warning("no closing tables for %s: %s", Path(index_path).name, exc)
        return None
    return target


def _current(target: Path) -> bool:
    """True when `target` exists in this version's framing (an older one is rewritten)."""
    try:
        with target.open("rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def load(index_path: str | Path) -> ByteAutomaton | None:
    """The tables written beside `index_path`; None when missing or damaged (logged)."""
    target = path_for(index_path)
    data = read_framed(target, MAGIC)
    if data is None:
        return None
    try:
        found = automaton_from_bytes(data)
    except ValueError as exc:
        log.warning("closing tables %s did not load: %s", target, exc)
        return None
    touch(target)
    return found
