"""Compiled grammars: token vocabularies, the process-wide Index cache, and compilation.

Knows: outlines-core's `Vocabulary` and `Index`, and which (vocabulary, key) pairs have
been compiled in this process. Does not know: formats or requests; the key is opaque here.

An Index is tied to a vocabulary, so entries are stored under (vocabulary fingerprint,
key). outlines-core releases the GIL while it compiles (measured: a 3 s compile in a
worker thread leaves the event loop running).

Disk tier: vLLM's engine core runs in another process, where this process's memory cache
is out of reach. After a compile, the server writes the Index's own serialisation
(`Index.__reduce__` -> `Index.from_binary(bytes)`, no pickle: loading runs no code) to
`<directory>/<vocabulary fingerprint>-<sha256(key)>.index`, atomically (temp file +
os.replace), behind a magic line, the payload's length and its CRC-32 (accidental damage;
the directory is the server's own, mode 0700). The path travels with the
ConstraintRef; the processor loads the file on a memory miss (milliseconds) and compiles
from the regex only when the file is missing or corrupt (logged). The directory is bounded
by `max_bytes`, least recently used (mtime; a load or a reuse touches the file) first out.
By default it is a temporary directory of this process, removed when it exits: an Index
is only valid for one outlines-core build and one vocabulary, and a free-form grammar
takes tens of MB, so nothing is left behind unless a directory is configured
(`--grammar-cache-dir`, which also lets a restarted server skip its compiles).

Memory tier: bounded by entries and by bytes, an entry weighing its serialised size (its
file's, or `index_bytes` without one). Measured on SmolLM2's 49k tokens: one tool with one
string argument makes a 21 MB Index, 15 optional string arguments 165 MB, so a count alone
does not bound memory. An Index larger than the whole byte bound is returned, not kept.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import functools
import hashlib
import logging
import os
import shutil
import tempfile
import threading
import zlib
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import outlines_core

log = logging.getLogger("regex_baseline.cache")

MAGIC = b"callgate-index/2\n"
HEADER_BYTES = len(MAGIC) + 12  # then the payload's length (8 bytes) and CRC-32 (4), little-endian
SUFFIX = ".index"
CLOSING_SUFFIX = ".closing"  # budget closing's tables (closing_store.py) beside an Index file
COMPANION_SUFFIXES = (CLOSING_SUFFIX,)  # written beside an Index file, evicted with it
DEFAULT_DISK_BYTES = 1 << 30
DEFAULT_MEMORY_BYTES = 1 << 30


@dataclass(frozen=True, slots=True)
class TokenVocabulary:
    """The engine's vocabulary for outlines-core: token bytes -> ids, and the EOS id."""

    inner: Any  # outlines_core.Vocabulary
    eos_token_id: int
    fingerprint: str
    size: int = field(default=0)
    tokens: Mapping[bytes, list[int]] = field(default_factory=dict, repr=False, compare=False)  # what `inner` holds


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
    return TokenVocabulary(inner, eos_token_id, digest.hexdigest()[:16], max(size, eos_token_id + 1), clean)


class IndexCache:
    """(vocabulary fingerprint, key) -> Index, least recently used first out, with one
    compile per entry at a time. Bounded by `max_entries` and by `max_bytes` (serialised
    size): an Index holds every allowed transition, and free text or a free-form JSON value
    allows most of the vocabulary in each of its states."""

    def __init__(
        self, max_entries: int = 64, disk: DiskTier | None = None, max_bytes: int = DEFAULT_MEMORY_BYTES
    ) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.disk = disk
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, str], tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self._building: dict[tuple[str, str], threading.Lock] = {}

    def get(self, key: str, vocabulary: TokenVocabulary) -> Any | None:
        """The Index in memory (marked recently used), None when not there."""
        return self._recent((vocabulary.fingerprint, key))

    def get_or_compile(
        self,
        key: str,
        regex: str,
        vocabulary: TokenVocabulary,
        path: str | None = None,
        guard: Callable[[], None] | None = None,
    ) -> Any:
        """From memory, else from the file at `path` (another process's compile), else
        compiled from `regex` (and written to this cache's disk tier, if any). `guard` runs
        just before a compile from the regex; what it raises propagates, nothing is cached."""
        slot = (vocabulary.fingerprint, key)
        found = self._recent(slot)
        if found is not None:
            return found
        with self._lock:
            gate = self._building.setdefault(slot, threading.Lock())
        try:
            with gate:
                found = self._recent(slot)
                if found is None:
                    found, nbytes = self._load_or_compile(key, regex, vocabulary, path, guard)
                    self._keep(slot, found, nbytes)
        finally:
            with self._lock:
                self._building.pop(slot, None)
        return found

    def _recent(self, slot: tuple[str, str]) -> Any | None:
        with self._lock:
            found = self._entries.get(slot)
            if found is None:
                return None
            self._entries.move_to_end(slot)
            return found[0]

    def _keep(self, slot: tuple[str, str], index: Any, nbytes: int) -> None:
        with self._lock:
            if nbytes > self.max_bytes:
                log.warning(
                    "grammar %s: its Index (%d bytes) is larger than the memory cache; not kept", slot[1][:16], nbytes
                )
                return
            self._entries[slot] = (index, nbytes)
            self._bytes += nbytes
            while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                _, (_, gone) = self._entries.popitem(last=False)
                self._bytes -= gone

    def _load_or_compile(
        self, key: str, regex: str, vocabulary: TokenVocabulary, path: str | None, guard: Callable[[], None] | None
    ) -> tuple[Any, int]:
        """The Index and its weight in bytes."""
        if path is not None:  # another process's file: read it, never write it
            found = load_given(Path(path), key, vocabulary)
            if found is not None:
                return found, _size(Path(path))
            found = _compiled(regex, vocabulary, guard)
            return found, _weight(found, None)
        own = None if self.disk is None else self.disk.path_for(vocabulary.fingerprint, key)
        found = None if own is None else read_index(own)
        if found is None:
            found = _compiled(regex, vocabulary, guard)
            if own is not None and self.disk is not None:
                self.disk.store(own, found)
        return found, _weight(found, own)

    def persisted(self, key: str, vocabulary: TokenVocabulary, index: Any) -> str | None:
        """The file of `index` in the disk tier (rewritten if evicted), None without one."""
        if self.disk is None:
            return None
        path = self.disk.path_for(vocabulary.fingerprint, key)
        if not touch(path):
            self.disk.store(path, index)
        return str(path)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """The serialised size of the Indexes held in memory."""
        return self._bytes

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0


def trim_heap() -> None:
    """Hand the C heap's free memory back to the system (glibc's malloc_trim; elsewhere a
    no-op). A compile allocates and frees hundreds of MB from worker threads (the Index
    build, its serialisation for the disk tier, an evicted Index), and glibc keeps what the
    threads' arenas freed until trimmed (tests/test_compile_pool.py; bench_compile_memory)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Any:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def compile_index(regex: str, vocabulary: TokenVocabulary) -> Any:
    """Compile `regex` over `vocabulary` (blocking; outlines-core cannot be interrupted)."""
    return outlines_core.Index(regex, vocabulary.inner)


def _compiled(regex: str, vocabulary: TokenVocabulary, guard: Callable[[], None] | None) -> Any:
    if guard is not None:
        guard()
    return compile_index(regex, vocabulary)


def _weight(index: Any, file: Path | None) -> int:
    """Serialised size of `index`: its file's payload when written, else serialised now."""
    on_disk = 0 if file is None else _size(file) - HEADER_BYTES
    if on_disk > 0:
        return on_disk
    try:
        return len(index_bytes(index))
    except TypeError:  # an Index that does not serialise (a test's stand-in) weighs nothing
        return 0


def index_bytes(index: Any) -> bytes:
    """outlines-core's own serialisation of an Index (what `Index.from_binary` reads)."""
    rebuild, (data,) = index.__reduce__()
    if rebuild != outlines_core.Index.from_binary or not isinstance(data, bytes):
        raise TypeError("this outlines-core Index does not reduce to Index.from_binary(bytes)")
    return data


def write_index(path: Path, index: Any) -> int:
    """Write `index` to `path` atomically (temp file in the same directory + os.replace).
    Returns the bytes written."""
    return write_framed(path, MAGIC, index_bytes(index))


def write_framed(path: Path, magic: bytes, data: bytes) -> int:
    """Write `magic`, the length and CRC-32 of `data`, then `data`, to `path` atomically.
    Returns the bytes written."""
    blob = magic + len(data).to_bytes(8, "little") + zlib.crc32(data).to_bytes(4, "little") + data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(blob)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return len(blob)


def read_framed(path: Path, magic: bytes) -> bytes | None:
    """The payload `write_framed` wrote, None when the file is missing or damaged (logged)."""
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("file %s unreadable: %s", path, exc)
        return None
    header = len(magic) + 12
    data = blob[header:]
    expected = len(data).to_bytes(8, "little") + zlib.crc32(data).to_bytes(4, "little")
    if blob[: len(magic)] != magic or blob[len(magic) : header] != expected:
        log.warning("file %s is corrupt (bad header, length or checksum)", path)
        return None
    return data


def read_index(path: Path) -> Any | None:
    """The Index in `path`, None when the file is missing or corrupt (logged)."""
    data = read_framed(path, MAGIC)
    if data is None:
        return None
    try:
        index = outlines_core.Index.from_binary(data)
    except ValueError as exc:
        log.warning("index file %s did not load: %s", path, exc)
        return None
    touch(path)
    return index


def load_given(path: Path, key: str, vocabulary: TokenVocabulary) -> Any | None:
    """The Index another process wrote for `key`; None (logged) when it is missing, corrupt
    or named for another vocabulary (the caller then compiles from the regex)."""
    if not path.name.startswith(vocabulary.fingerprint + "-"):
        log.warning("grammar %s: index file %s is for another vocabulary", key[:16], path)
        found = None
    else:
        found = read_index(path)
    if found is None:
        log.warning("grammar %s: no usable index file at %s, compiling from the regex", key[:16], path)
    return found


def touch(path: Path) -> bool:
    """Mark `path` recently used; False when it is gone."""
    try:
        os.utime(path)
    except FileNotFoundError:
        return False
    return True


class DiskTier:
    """Index files under one directory, at most `max_bytes` of them (oldest mtime out).
    `directory` None: a temporary directory, made on first use, removed at exit."""

    def __init__(self, directory: str | Path | None = None, max_bytes: int = DEFAULT_DISK_BYTES) -> None:
        self.max_bytes = max_bytes
        self._wanted = None if directory is None else Path(directory).expanduser()
        self._directory: Path | None = None
        self._lock = threading.Lock()

    @property
    def directory(self) -> Path:
        """The directory, made on first use."""
        with self._lock:
            if self._directory is None:
                self._directory = self._make()
            return self._directory

    def _make(self) -> Path:
        if self._wanted is None:
            made = Path(tempfile.mkdtemp(prefix="callgate-grammars-"))
            atexit.register(_remove_owned, made, os.getpid())
            return made
        self._wanted.mkdir(mode=0o700, parents=True, exist_ok=True)
        return self._wanted

    def path_for(self, fingerprint: str, key: str) -> Path:
        name = hashlib.sha256(key.encode()).hexdigest()[:32]
        return self.directory / f"{fingerprint}-{name}{SUFFIX}"

    def store(self, path: Path, index: Any) -> None:
        """Write `path` and evict; a failure is logged (the engine then compiles itself)."""
        try:
            write_index(path, index)
            self.evict(keep=path)
        except (OSError, TypeError) as exc:
            log.warning("could not write index file %s: %s", path, exc)

    def evict(self, keep: Path) -> None:
        """Delete least recently used Index files, each with its companions (the same name,
        another suffix: budget closing's tables), until the total fits `max_bytes` (not `keep`)."""
        files = []
        for entry in self.directory.glob(f"*{SUFFIX}"):
            try:
                st = entry.stat()
            except FileNotFoundError:
                continue
            companions = [entry.with_suffix(c) for c in COMPANION_SUFFIXES]
            size = st.st_size + sum(_size(c) for c in companions)
            files.append((st.st_mtime_ns, size, entry, companions))
        total = sum(size for _, size, _, _ in files)
        for _, size, entry, companions in sorted(files, key=lambda f: (f[0], str(f[2]))):
            if total <= self.max_bytes:
                break
            if entry != keep:
                entry.unlink(missing_ok=True)
                for c in companions:
                    c.unlink(missing_ok=True)
                total -= size


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _remove_owned(directory: Path, owner_pid: int) -> None:
    if os.getpid() == owner_pid:  # not in a forked child that inherited the handler
        shutil.rmtree(directory, ignore_errors=True)


CACHE = IndexCache(disk=DiskTier())


def configure_disk(directory: str | None, max_bytes: int = DEFAULT_DISK_BYTES) -> None:
    """Where this process writes compiled Indexes (None: a temporary directory removed at exit)."""
    CACHE.disk = DiskTier(directory, max_bytes)


def get_index(key: str, regex: str, vocabulary: TokenVocabulary, path: str | None = None) -> Any:
    """The Index for `key`: from memory, from the file at `path` when given (written by the
    server for the engine process), else compiled from `regex` over `vocabulary` (blocking)."""
    return CACHE.get_or_compile(key, regex, vocabulary, path)
