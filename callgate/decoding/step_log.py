"""Per-step mask timings written to a file, so a process other than vLLM's engine core can read them.

Knows: a line format and when to flush. Does not know: what is timed (processor.py records).

vLLM runs the logits processor inside its engine-core process, so the processor's in-memory
timings (`processor.STEP_TIMINGS`) are out of a benchmark's reach. With the environment
variable `CALLGATE_MASK_TIMINGS=/path/file` set for the server (the engine process inherits
it), every ConstrainedBatch appends one line per masked step:

    <elapsed_ns> <constrained_rows> <budget_ns> <at_ns> <passed_rows> <advance_ns> <fill_ns> <check_ns> <kernel_ns>\\n

(host time of the whole `apply`, rows constrained, the part spent in budget closing,
`time.monotonic_ns()` when it was recorded: CLOCK_MONOTONIC, one clock for every process
on the machine, so a reader can tell which steps fell inside a window it timed, and the
rows that took their argmax unmasked, greedy rows whose grammar admitted it; then the parts
of the step: feeding the rows' new tokens to their matchers, llguidance's masks (fills,
forced tokens, the kept start masks), the argmax check of greedy rows, callgate's kernel;
what is left of `elapsed_ns` is the loop around them. Lines from before a field read it as
-1: four fields (no `passed`), five (no parts)), in
blocks of `flush_every` lines or after `flush_after_s` seconds (checked at each record),
each block in one `write` on a file opened for appending, so the lines of several engine
processes do not interleave. The block still buffered is written at `close()` and when the
process exits normally (atexit; vLLM's engine core turns SIGTERM into a normal exit); a
killed process loses it. A reader that needs every step stops the server first.
`read_step_log(path)` reads the lines back; a torn last line is skipped.
"""

from __future__ import annotations

import atexit
import os
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

ENV_VAR = "CALLGATE_MASK_TIMINGS"
DEFAULT_FLUSH_EVERY = 64
DEFAULT_FLUSH_AFTER_S = 1.0


@dataclass(frozen=True, slots=True)
class StepRecord:
    elapsed_ns: int
    rows: int
    budget_ns: int
    at_ns: int = 0
    passed: int = -1  # rows left unmasked, their argmax admitted (-1: a log from before this field)
    advance_ns: int = -1  # the step's parts (-1: a log from before these fields)
    fill_ns: int = -1
    check_ns: int = -1
    kernel_ns: int = -1


class StepLog:
    """Buffered appender of StepRecords to one file."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        flush_every: int = DEFAULT_FLUSH_EVERY,
        flush_after_s: float = DEFAULT_FLUSH_AFTER_S,
    ) -> None:
        if flush_every < 1:
            raise ValueError(f"flush_every must be >= 1, got {flush_every}")
        self.path, self.flush_every, self.flush_after_s = Path(path), flush_every, flush_after_s
        self.pending: list[str] = []
        self.flushed_s = time.monotonic()
        atexit.register(self.close)
        _OPEN.add(self)

    @classmethod
    def from_environment(cls, environ: dict[str, str] | None = None) -> StepLog | None:
        """A log at `$CALLGATE_MASK_TIMINGS`, None when unset or empty."""
        path = (os.environ if environ is None else environ).get(ENV_VAR, "")
        return cls(path) if path else None

    def record(
        self,
        elapsed_ns: int,
        rows: int,
        budget_ns: int,
        at_ns: int | None = None,
        passed: int = 0,
        parts: tuple[int, int, int, int] = (0, 0, 0, 0),
    ) -> None:
        """Buffer one step (`at_ns`: now when not given; `parts`: advance, fill, check and
        kernel ns)."""
        at = time.monotonic_ns() if at_ns is None else at_ns
        advance, fill, check, kernel = parts
        self.pending.append(f"{elapsed_ns} {rows} {budget_ns} {at} {passed} {advance} {fill} {check} {kernel}\n")
        if len(self.pending) >= self.flush_every or time.monotonic() - self.flushed_s >= self.flush_after_s:
            self.flush()

    def flush(self) -> None:
        self.flushed_s = time.monotonic()
        if not self.pending:
            return
        block, self.pending = "".join(self.pending).encode(), []
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, block)
        finally:
            os.close(fd)

    def close(self) -> None:
        self.flush()
        atexit.unregister(self.close)


_OPEN: weakref.WeakSet[StepLog] = weakref.WeakSet()


def flush_all() -> None:
    """Write what every log of this process still buffers (a reader in the engine's own
    process, vLLM's in-process engine, reads complete logs without waiting for exit)."""
    for log in list(_OPEN):
        log.flush()


def read_step_log(path: str | os.PathLike[str]) -> list[StepRecord]:
    """Every complete record in the file at `path` (none when it does not exist)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    records = []
    for line in text.splitlines(keepends=True):
        fields = line.split()
        if line.endswith("\n") and len(fields) in (4, 5, 9) and all(f.isdigit() for f in fields):
            records.append(StepRecord(*(int(f) for f in fields)))
    return records
