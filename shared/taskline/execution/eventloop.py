"""The worker's event loop: one asyncio loop per process, on a daemon thread of its own, that
runs `async def` handlers as tasks.

Invariant: nothing the worker must do on time runs on this loop. Lease renewal, the self-fence
and timeouts live on their own threads (taskline.execution.leases, fencing, deadlines), so a
handler that blocks the loop (a `time.sleep`, a synchronous driver) delays only the other
coroutine handlers, never a renewal or a timeout. The loop is started on the first coroutine
handler a process runs: a worker with only thread handlers has no loop thread at all. The loop
ticks every TICK_S, so how long it has been held (`lag_s`) is visible while it is held: the
worker exports it as taskline_worker_event_loop_lag_seconds.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

Ended = Callable[[Any, BaseException | None], None]
LOOP_THREAD = "taskline-asyncio"
TICK_S = 0.1
"""How often the loop notes that it runs: the resolution of `lag_s`, at ten wake-ups a second."""


def on_event_loop() -> bool:
    """Whether the caller runs on an event loop's thread, where blocking stalls every task."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


@dataclass(eq=False)
class _Started:
    """A coroutine handed to the loop; its task exists once the loop has picked it up."""

    task: asyncio.Task[Any] | None = None
    cancelled: bool = False


class EventLoop:
    """Runs coroutines as tasks on one loop thread; `run` and its cancel work from any thread."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        """Running tasks: the loop keeps only weak references to them."""
        self._ticked: float | None = None
        """When the loop last ran its tick (monotonic); None while there is no loop."""

    def lag_s(self) -> float:
        """How long the loop has been held beyond its tick: 0 when it runs freely or is not
        started, the seconds so far while a handler blocks it."""
        ticked = self._ticked
        return 0.0 if ticked is None else max(time.monotonic() - ticked - TICK_S, 0.0)

    def run(self, coroutine: Callable[[], Coroutine[Any, Any, Any]],
            ended: Ended) -> Callable[[], None]:
        """Start `coroutine()` as a task; `ended(result, error)` runs on the loop when the task
        ends (error is CancelledError for a task cancelled before or while it ran). Returns a
        function, callable from any thread, that cancels the task."""
        started = _Started()
        loop = self._running()
        loop.call_soon_threadsafe(self._start, started, coroutine, ended)
        # Callbacks run in the order they were scheduled: the task exists when a cancel runs.
        return lambda: loop.call_soon_threadsafe(self._cancel, started)

    def stop(self) -> None:
        """Stop the loop; tasks still running (handlers that ignore cancellation) are dropped
        with it, as abandoned handler threads are left to the process's exit."""
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
        self._ticked = None

    def _running(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                self._loop = loop  # before its thread runs the first tick, which checks it
                self._ticked = time.monotonic()
                loop.call_soon(self._tick, loop)
                threading.Thread(target=self._serve, args=(loop,), name=LOOP_THREAD,
                                 daemon=True).start()
            return self._loop

    @staticmethod
    def _serve(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            loop.close()

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._loop is loop:  # a stopped loop stops ticking
            self._ticked = time.monotonic()
            loop.call_later(TICK_S, self._tick, loop)

    def _start(self, started: _Started, coroutine: Callable[[], Coroutine[Any, Any, Any]],
               ended: Ended) -> None:
        task = asyncio.get_running_loop().create_task(coroutine())
        started.task = task
        self._tasks.add(task)
        task.add_done_callback(lambda done: self._ended(done, ended))
        if started.cancelled:
            task.cancel()

    def _cancel(self, started: _Started) -> None:
        started.cancelled = True
        if started.task is not None:
            started.task.cancel()

    def _ended(self, task: asyncio.Task[Any], ended: Ended) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            ended(None, asyncio.CancelledError())
            return
        error = task.exception()
        ended(None if error is not None else task.result(), error)
