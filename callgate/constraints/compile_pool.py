"""The grammar compile workers: a fixed number of threads, shared compiles, two clocks.

Knows: threads, asyncio futures, which compile each waiting request joined. Does not know:
grammars, Indexes, the cache (the work is an opaque callable).

A compile is native code that Python cannot interrupt, so a compile that overran its time
limit keeps its thread until it ends. Hence:

* the time limit runs from the moment a worker *starts* the compile, not from when the
  request arrived: a request queued behind other compiles is not told its schema is too
  complex;
* a request that waits longer than the time limit for a worker gets CompilerBusyError
  (503, retryable) at once, and a queued compile nobody waits for any more is dropped;
* a grammar that holds no schema (the caller passes `param=None`: tool_choice `none`'s
  content grammar) has nothing to simplify: its overrun is CompilerBusyError too, and a
  retry that joins the compile waits its own full time limit for it;
* requests for the same slot (vocabulary, grammar key) share one compile, so a client
  retrying a grammar that overran does not start another;
* the work is handed its Job and calls `job.proceed()` before its costly step: a job that
  every waiter gave up on stops there (Abandoned) instead of building what nobody awaits.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from callgate.errors import CompilerBusyError, SchemaTooComplexError

T = TypeVar("T")


class Abandoned(Exception):
    """Raised by `Job.proceed` in a worker when no request waits for the job any more."""


@dataclass(slots=True, weakref_slot=True)
class Job:
    """One compile, shared by every request waiting for its slot."""

    slot: Hashable
    pool: CompilePool
    waiters: int = 1
    started: Future[float] = field(default_factory=Future)  # monotonic time its worker took it
    done: Future[Any] | None = None

    def proceed(self) -> None:
        """In the worker: raise Abandoned when nobody waits for this job any more."""
        self.pool._check_wanted(self)


class CompilePool:
    """At most `workers` compiles at once; see the module docstring for the rules."""

    def __init__(self, workers: int = 2) -> None:
        self.workers = workers
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="callgate-grammar")
        self._lock = threading.RLock()  # a cancel runs `_finished` at once, lock held
        self._jobs: dict[Hashable, Job] = {}
        self._busy = 0  # jobs submitted and not finished: running, then queued

    @property
    def busy(self) -> int:
        """Compiles running or queued."""
        return self._busy

    @property
    def waiting(self) -> int:
        """Requests waiting for a compile."""
        with self._lock:
            return sum(job.waiters for job in self._jobs.values())

    async def run(self, slot: Hashable, work: Callable[[Job], Any], *, timeout_s: float, param: str | None) -> Any:
        """The result of `work(job)`, computed in a worker (or the one already computing
        `slot`). Raises CompilerBusyError (no worker within `timeout_s`), on a compile past
        `timeout_s` SchemaTooComplexError naming `param` (the request field whose schemas
        the grammar holds) or, with `param` None (it holds none), CompilerBusyError; or
        what `work` raised."""
        arrived_at = time.monotonic()
        job, queued = self._join(slot, work)
        try:
            started_at = await self._start(job, timeout_s if queued else None)
            # a schema-free grammar always ends: a retry that joined it waits as long again
            since = started_at if param is not None else max(started_at, arrived_at)
            remaining_s = max(since + timeout_s - time.monotonic(), 0.0)
            assert job.done is not None
            try:
                return await _wait(job.done, remaining_s)
            except TimeoutError:
                raise _overrun(timeout_s, param) from None
        finally:
            self._leave(job)

    async def _start(self, job: Job, queue_s: float | None) -> float:
        try:
            return await _wait(job.started, queue_s)
        except TimeoutError:
            raise CompilerBusyError(
                f"every grammar compile worker stayed busy for {queue_s:g} s; retry later",
                code="grammar_compiler_busy",
            ) from None

    def _join(self, slot: Hashable, work: Callable[[Job], Any]) -> tuple[Job, bool]:
        """The job computing `slot` (joined), else a new one; and whether it waits for a worker."""
        with self._lock:
            job = self._jobs.get(slot)
            if job is not None:
                job.waiters += 1
                return job, not job.started.done()
            job = Job(slot, self)
            queued = self._busy >= self.workers
            self._jobs[slot] = job
            self._busy += 1
            job.done = self._executor.submit(self._work, job, work)
            # by weak reference: job -> its future -> this callback -> job would be a cycle, and
            # the future holds the result (an Index of up to hundreds of MB) until the cyclic
            # GC, which a server allocating little runs rarely (measured: bench_compile_memory)
            ref = weakref.ref(job)
            job.done.add_done_callback(lambda _: self._finished(ref()))
            return job, queued

    @staticmethod
    def _work(job: Job, work: Callable[[Job], Any]) -> Any:
        job.started.set_result(time.monotonic())
        return work(job)

    def _finished(self, job: Job | None) -> None:
        """Once the job's result is set (or it was dropped from the queue). None: the job is
        gone, so no longer in `_jobs` either (the table holds it); only the count is left."""
        with self._lock:
            self._busy -= 1
            if job is not None and self._jobs.get(job.slot) is job:
                del self._jobs[job.slot]

    def _leave(self, job: Job) -> None:
        with self._lock:
            job.waiters -= 1
            if job.waiters == 0 and job.done is not None:
                job.done.cancel()  # drops it from the queue unless a worker took it (then `_finished`)

    def _check_wanted(self, job: Job) -> None:
        with self._lock:
            if job.waiters > 0:
                return
            if self._jobs.get(job.slot) is job:
                del self._jobs[job.slot]  # a new request for the slot starts afresh
        raise Abandoned(f"grammar compile {job.slot!r}: every request gave up; stopped")


def _overrun(timeout_s: float, param: str | None) -> Exception:
    """The error of a compile that ran past `timeout_s` (it goes on, and lands in the cache)."""
    if param is None:
        return CompilerBusyError(
            f"the server is still compiling this format's grammar (it holds no schema; past {timeout_s:g} s); "
            "retry shortly",
            code="grammar_compiler_busy",
        )
    return SchemaTooComplexError(
        f"the tool/response schemas did not compile into a grammar within {timeout_s:g} s; simplify them "
        "(fewer tools, optional properties or bounds) or raise the server's --grammar-timeout. The compile "
        "goes on: once it has ended, the same tools are served from the grammar cache",
        param=param,
    )


async def _wait(source: Future[T], timeout_s: float | None) -> T:
    """`source`'s result, waiting at most `timeout_s`; giving up leaves `source` running."""
    inner = asyncio.wrap_future(source)
    try:
        return await asyncio.wait_for(asyncio.shield(inner), timeout_s)
    except BaseException:
        inner.add_done_callback(_retrieve)  # shield forgets it: no "exception never retrieved"
        raise


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
