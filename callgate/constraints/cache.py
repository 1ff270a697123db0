"""Compiled grammars: token vocabularies, the process-wide Index cache, and compilation.

Knows: outlines-core's `Vocabulary` and `Index`, and which (vocabulary, key) pairs have
been compiled in this process. Does not know: formats or requests; the key is opaque here.

An Index is tied to a vocabulary, so entries are stored under (vocabulary fingerprint,
key). A process that gets only a key and a regex (vLLM's engine core, another replica)
compiles from the regex on its first miss. outlines-core releases the GIL while it
compiles (measured: a 3 s compile in a worker thread leaves the event loop running).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import outlines_core


@dataclass(frozen=True, slots=True)
class TokenVocabulary:
    """The engine's vocabulary for outlines-core: token bytes -> ids, and the EOS id."""

    inner: Any  # outlines_core.Vocabulary
    eos_token_id: int
    fingerprint: str
    size: int = field(default=0)


def token_vocabulary(tokens: Mapping[bytes, list[int]], eos_token_id: int) -> TokenVocabulary:
    """Build from `Tokenizer.vocabulary()` (bytes -> ids; special tokens and EOS left out).

    EOS is dropped if present (outlines-core allows it only at final states)."""
    clean = {t: [i for i in ids if i != eos_token_id] for t, ids in tokens.items()}
    clean = {t: ids for t, ids in clean.items() if ids and t}
    digest = hashlib.sha256(str(eos_token_id).encode())
    for t in sorted(clean):
        digest.update(len(t).to_bytes(4, "little") + t + repr(sorted(clean[t])).encode())
    size = max((max(ids) for ids in clean.values()), default=-1) + 1
    inner = outlines_core.Vocabulary(eos_token_id, clean)
    return TokenVocabulary(inner, eos_token_id, digest.hexdigest()[:16], max(size, eos_token_id + 1))


class IndexCache:
    """(vocabulary fingerprint, key) -> Index, least recently used first out, with one
    compile per entry at a time. Bounded: an Index holds every allowed transition, and free
    text or a free-form JSON value allows most of the vocabulary in each of its states
    (measured on SmolLM2's 49k tokens: tens to hundreds of MB for a free-form object)."""

    def __init__(self, max_entries: int = 64) -> None:
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._building: dict[tuple[str, str], threading.Lock] = {}

    def get(self, key: str, vocabulary: TokenVocabulary) -> Any | None:
        return self._entries.get((vocabulary.fingerprint, key))

    def get_or_compile(self, key: str, regex: str, vocabulary: TokenVocabulary) -> Any:
        slot = (vocabulary.fingerprint, key)
        found = self._entries.get(slot)
        if found is not None:
            with self._lock:
                if slot in self._entries:
                    self._entries.move_to_end(slot)
            return found
        with self._lock:
            gate = self._building.setdefault(slot, threading.Lock())
        with gate:
            found = self._entries.get(slot)
            if found is None:
                found = outlines_core.Index(regex, vocabulary.inner)
                with self._lock:
                    self._entries[slot] = found
                    while len(self._entries) > self.max_entries:
                        self._entries.popitem(last=False)
        with self._lock:
            self._building.pop(slot, None)
        return found

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()


CACHE = IndexCache()


def get_index(key: str, regex: str, vocabulary: TokenVocabulary) -> Any:
    """The Index for `key`, compiled from `regex` over `vocabulary` on a miss (blocking).

    Used by callgate.constraints.build and by the logits processor, possibly in another
    process where only the key and the regex arrived.
    """
    return CACHE.get_or_compile(key, regex, vocabulary)
