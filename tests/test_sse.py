"""callgate.serving.surfaces.sse.after: a streamed response's turn is closed on the event loop."""

from __future__ import annotations

import threading

from callgate.serving.surfaces import sse


async def test_the_after_task_runs_close_on_the_event_loop_thread() -> None:
    """Starlette runs a plain function in its thread pool; the turn's close (which cancels
    its quick heads' asyncio tasks) must run on the loop, and without a thread hop."""
    loop_thread = threading.get_ident()
    calls: list[int] = []
    await sse.after(lambda: calls.append(threading.get_ident()))()
    assert calls == [loop_thread]


async def test_a_plain_background_task_would_have_hopped_threads() -> None:
    """The check above can fail: Starlette's own BackgroundTask of the same function runs
    it in a worker thread."""
    from starlette.background import BackgroundTask

    calls: list[int] = []
    await BackgroundTask(lambda: calls.append(threading.get_ident()))()
    assert calls and calls[0] != threading.get_ident()
