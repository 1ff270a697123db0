"""The audit log: append-only JSONL, one record per tool-call candidate and its verdict
(and one per answer that was a call written outside the call markup).

Knows: how a record is made durable — one `os.write` of one whole line on an O_APPEND
descriptor, then `os.fsync` before `write` returns, so a record is on disk before the
response that carries its candidate is sent; how a crash's torn line is contained (on
open a file that does not end with a newline gets one, and `read_records` skips lines
that are not whole JSON objects); size-based rotation (`path` -> `path.1` -> ... ->
`path.keep`, the oldest dropped). `write` blocks: call it off the event loop.
Does not know: what a candidate is (records are JSON objects made by `candidate_record`
from plain values), HTTP, or any secret — nothing from request headers is ever recorded.
"""

from __future__ import annotations

import datetime
import json
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_KEEP = 5


class AuditLog:
    """An open audit log at `path`. Thread-safe; `close` releases the descriptor."""

    def __init__(self, path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES, keep: int = DEFAULT_KEEP):
        if max_bytes < 1 or keep < 0:
            raise ValueError(f"audit log: max_bytes must be >= 1 and keep >= 0, got {max_bytes} and {keep}")
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.keep = keep
        self._lock = threading.Lock()
        self._fd = self._open()

    def write(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Append `records` (one line each) and fsync. Blocking; raises OSError on failure."""
        lines = [encode_record(r) for r in records]
        if not lines:
            return
        with self._lock:
            for line in lines:
                if self._size() > 0 and self._size() + len(line) > self.max_bytes:
                    self._rotate()
                _write_all(self._fd, line)
            os.fsync(self._fd)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def _open(self) -> int:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        if _ends_torn(self.path):
            _write_all(fd, b"\n")  # a crash tore the last line: the next record starts clean
            os.fsync(fd)
        return fd

    def _size(self) -> int:
        return os.fstat(self._fd).st_size

    def _rotate(self) -> None:
        os.close(self._fd)
        self._fd = -1
        if self.keep == 0:
            self.path.unlink()
        else:
            for n in range(self.keep - 1, 0, -1):
                older = rotated_path(self.path, n)
                if older.exists():
                    os.replace(older, rotated_path(self.path, n + 1))
            os.replace(self.path, rotated_path(self.path, 1))
        self._fd = self._open()
        _fsync_dir(self.path.parent)  # the renames are durable too


def rotated_path(path: Path, n: int) -> Path:
    return path.with_name(f"{path.name}.{n}")


def encode_record(record: Mapping[str, Any]) -> bytes:
    """One canonical JSON line (sorted keys, no NaN); a newline in a value is escaped."""
    return (
        json.dumps(record, sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False) + "\n"
    ).encode()


@dataclass(frozen=True, slots=True)
class AuditRead:
    records: tuple[dict[str, Any], ...]
    skipped: int  # lines that were not whole JSON objects (a crash's torn line)


def read_records(path: str | os.PathLike[str]) -> AuditRead:
    """Every whole record of one audit file, in order; torn lines are counted, not raised."""
    records: list[dict[str, Any]] = []
    skipped = 0
    for line in _lines(Path(path)):
        try:
            doc = json.loads(line)
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            records.append(doc)
        else:
            skipped += 1
    return AuditRead(tuple(records), skipped)


def candidate_record(
    *,
    request_id: str,
    round_index: int,
    model: str,
    fmt: str,
    call_id: str,
    tool: str,
    arguments: Mapping[str, Any],
    raw: str,
    diagnostics: Sequence[Mapping[str, Any]],
    verdict: Mapping[str, Any],
    validator: str,
    constrained: bool,
    idempotency_key: str,
    recovered_from_round: int | None = None,
) -> dict[str, Any]:
    """The record of one candidate. `arguments` are the model's (canonical once encoded);
    `verdict` is the verdict object (with normalised arguments when the validator gave any),
    or `{"verdict": "unavailable", "error": ...}` when no verdict could be had;
    `idempotency_key` is the envelope's (it joins the record to a downstream executor's).
    `recovered_from_round`: the candidate was asked for again, in the markup, after that
    round wrote it outside (serving/recovery.py); the key is present only then."""
    extra = {} if recovered_from_round is None else {"recovered_from_round": recovered_from_round}
    return {
        "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds"),
        "request_id": request_id,
        "round": round_index,
        "model": model,
        "format": fmt,
        "call_id": call_id,
        "tool": tool,
        "arguments": dict(arguments),
        "raw": raw,
        "diagnostics": [dict(d) for d in diagnostics],
        "verdict": dict(verdict),
        "validator": validator,
        "constrained": constrained,
        "idempotency_key": idempotency_key,
        **extra,
    }


def outside_markup_record(
    *,
    request_id: str,
    round_index: int,
    model: str,
    fmt: str,
    tool: str,
    raw: str,
    diagnostics: Sequence[Mapping[str, Any]],
    recovery: Mapping[str, Any],
    constrained: bool,
) -> dict[str, Any]:
    """The record of an answer that was a call to `tool` written outside the format's call
    markup (`raw`: its text): no candidate, so no verdict; `recovery` says whether it was
    asked for again and in which round (serving/recovery.py). `kind` tells it from a
    candidate's record."""
    return {
        "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds"),
        "kind": "call_outside_markup",
        "request_id": request_id,
        "round": round_index,
        "model": model,
        "format": fmt,
        "tool": tool,
        "raw": raw,
        "diagnostics": [dict(d) for d in diagnostics],
        "recovery": dict(recovery),
        "constrained": constrained,
    }


def _lines(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                yield line


def _ends_torn(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() == 0:
            return False
        f.seek(-1, os.SEEK_END)
        return f.read(1) != b"\n"


def _write_all(fd: int, data: bytes) -> None:
    """One os.write; a short write (disk full) is finished rather than left torn."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
