"""The handler runner: a pool of daemon threads that run handlers, each under its job's timeout,
and hand `async def` handlers to the process's event loop (taskline.execution.eventloop).

Invariant: at most `concurrency` handlers run at once, threads and coroutines together: a pool
thread takes a job only holding one of `concurrency` permits, keeps it while a thread handler
runs, and passes it to the task of a coroutine handler, which gives it back when it ends. The
pool always has `concurrency` threads able to take work. Python cannot kill a thread, so a
handler that outlives its timeout is abandoned: its thread is written off and a replacement is
started at once; a coroutine is cancelled, and one that ignores the cancellation is written off
the same way. A written-off handler gives its permit back at once. When more than `concurrency`
abandoned handlers are still running, the runner asks for the worker to be recycled (a fresh
process), so stuck handlers cannot leak forever. The threads are daemons: a stuck one never
blocks the exit.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from taskline import tracing
from taskline.errors import NonRetryableError
from taskline.execution.attempts import Attempt
from taskline.execution.deadlines import Deadline, Deadlines
from taskline.execution.eventloop import EventLoop
from taskline.handlers import registry

log = logging.getLogger(__name__)

Finished = Callable[[Attempt, Any, BaseException | None, float], None]

HAND_OFF_MAX_S = 0.001
"""How long `hand_off` may keep the caller off the GIL: a few thread wake-ups."""
_HAND_OFF_POLL_S = 0.00005


class NoHandler(NonRetryableError):
    """No handler is registered for this job type."""


class BadResult(NonRetryableError):
    """The handler's result cannot be stored as JSON."""


def check_result(result: Any) -> None:
    """Raise BadResult unless PostgreSQL's jsonb can store `result` as it is."""
    if result is None or type(result) in (bool, int):
        return  # the common no-result case, without a JSON round trip
    try:
        text = json.dumps(result, ensure_ascii=False, allow_nan=False)
        text.encode("utf-8")  # lone surrogates fail here, as they would in jsonb
    except (TypeError, ValueError) as err:
        raise BadResult(f"result is not storable as JSON: {err}") from None
    if "\\u0000" in text:
        raise BadResult("result contains a NUL character, which jsonb cannot store")


def is_async(attempt: Attempt) -> bool:
    """Whether the attempt's handler is an `async def` (a job without a handler is not)."""
    fn = registry.get(attempt.job.type)
    return fn is not None and fn.is_async


def call_handler(attempt: Attempt) -> Any:
    """Run the attempt's registered handler on this thread and return its storable result; the
    one call of a thread handler by a worker's pool and by `taskline.testing.drain`, which runs
    a coroutine handler here too, on an event loop of its own (`run_coroutine`)."""
    with tracing.execute(attempt.job, attempt.ctx.worker_id):
        fn = registry.get(attempt.job.type)
        if fn is None:
            raise NoHandler(f"no handler registered for type {attempt.job.type}")
        try:
            result = fn.run(attempt.job.payload, attempt.ctx)  # validated into its payload type
            if fn.is_async:
                result = run_coroutine(result)
        finally:
            _flush_progress(attempt)
        check_result(result)
        return result


async def call_async_handler(attempt: Attempt) -> Any:
    """`call_handler` for an `async def` handler, awaited on the worker's event loop."""
    with tracing.execute(attempt.job, attempt.ctx.worker_id):
        fn = registry.get(attempt.job.type)
        if fn is None:
            raise NoHandler(f"no handler registered for type {attempt.job.type}")
        try:
            result = await fn.run(attempt.job.payload, attempt.ctx)
        finally:
            _flush_progress(attempt)
        check_result(result)
        return result


def run_coroutine(coroutine: Any) -> Any:
    """Run `coroutine` to its end on a fresh event loop and return its result: on this thread,
    or on a thread of its own when this one already runs a loop (a test under pytest-asyncio),
    which cannot be re-entered."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = asyncio.run(coroutine)
        except BaseException as err:  # re-raised on the caller's thread
            outcome["error"] = err

    thread = threading.Thread(target=run, name="taskline-run-coroutine")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def _flush_progress(attempt: Attempt) -> None:
    """The last progress value, written before the outcome is reported (best effort: a write
    PostgreSQL refuses now would not let the outcome through either)."""
    reporter = attempt.ctx.progress_reporter
    if reporter is None:
        return
    try:
        reporter.flush()
    except Exception as err:
        log.warning("could not write the last progress", extra=attempt.log_extra(
            "progress", error=str(err)))


class Ready:
    """Attempts waiting for a pool thread, most urgent first and FIFO within a priority.

    More jobs than threads wait only when the worker claims ahead (taskline_worker.pace); then
    a thread that frees takes the most urgent of them, as the ready lists would have given it.
    A stop marker sorts after every attempt, so a stopping pool finishes what it was handed.

    An idle thread parks on a lock of its own, and `put_many` releases as many parked threads
    as it adds jobs, after it has let go of the heap's lock: a woken thread then never blocks
    again on the lock its waker still holds (a Condition's waiter must retake its lock, which
    on a busy machine can cost a hand-off a second sleep and wake-up), and a batch of jobs
    takes that lock once.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, int, Attempt | None]] = []
        self._order = itertools.count()
        self._lock = threading.Lock()
        self._parked: list[threading.Lock] = []
        """The locks idle threads block on, each held (acquired) until a put releases it."""
        self._waking = 0
        """Threads released by a put that have not yet looked at the heap again."""
        self._own = threading.local()

    @property
    def idle(self) -> int:
        """Threads waiting in `get`: a job put now starts without waiting for one."""
        return len(self._parked) + self._waking

    def put(self, attempt: Attempt | None) -> None:
        self.put_many((attempt,))

    def put_many(self, attempts: Sequence[Attempt | None]) -> None:
        with self._lock:
            for attempt in attempts:
                rank = (1, 0) if attempt is None else (0, -attempt.job.priority)
                heapq.heappush(self._heap, (*rank, next(self._order), attempt))
            woken = [self._parked.pop() for _ in range(min(len(attempts), len(self._parked)))]
            self._waking += len(woken)
        for park in woken:
            park.release()

    def get(self) -> Attempt | None:
        park: threading.Lock | None = None
        while True:
            with self._lock:
                if park is not None:
                    self._waking -= 1
                if self._heap:
                    return heapq.heappop(self._heap)[3]
                park = self._park()
                self._parked.append(park)
            park.acquire()  # until a put releases it (at once if it already has)

    def _park(self) -> threading.Lock:
        """This thread's parking lock, held: the thread's next `acquire` blocks on it."""
        park: threading.Lock | None = getattr(self._own, "park", None)
        if park is None:
            park = self._own.park = threading.Lock()
            park.acquire()
        return park

    def empty(self) -> bool:
        return not self._heap

    def untaken(self) -> bool:
        """Whether a job waits although a thread is idle (it is about to be taken)."""
        return bool(self._heap) and self.idle > 0


class _ThreadState(threading.local):
    """Per thread, for a pool thread: `finishing` while its `on_finished` runs, and `next`,
    the attempt that callback submitted for this thread to run next (see Runner.submit). The
    class attributes are every thread's defaults, so other threads read them without a miss."""

    finishing = False
    next: Attempt | None = None


@dataclass(eq=False)
class _Running:
    """A coroutine handler's run: when it started, its timeout and the cancel of its task."""

    attempt: Attempt
    started: float
    timer: Deadline | None = None
    cancel: Callable[[], None] | None = None


class Runner:
    """Runs submitted attempts on `concurrency` threads, or as tasks on the event loop for
    `async def` handlers, at most `concurrency` at once; reports every end through callbacks.

    `on_finished(attempt, result, error, seconds)` runs on the handler's thread (on the loop's
    thread for a coroutine) when it returns or raises; `on_timeout(attempt)` runs on the
    deadline thread when a handler is abandoned; `on_recycle()` runs once abandoned handlers
    outnumber the slots.
    """

    def __init__(self, concurrency: int, deadlines: Deadlines, *, on_finished: Finished,
                 on_timeout: Callable[[Attempt], None], on_recycle: Callable[[], None]) -> None:
        self.concurrency = concurrency
        self._deadlines = deadlines
        self._on_finished = on_finished
        self._on_timeout = on_timeout
        self._on_recycle = on_recycle
        self._queue = Ready()
        self._lock = threading.Lock()
        self._abandoned = 0
        self._names = itertools.count(1)
        self._local = _ThreadState()
        self._permits = threading.Semaphore(concurrency)
        """Handlers that may run now: held by a pool thread from taking a job to its end, or
        by a coroutine's task (see the module's invariant)."""
        self.loop = EventLoop()

    @property
    def abandoned(self) -> int:
        """Written-off handlers (threads or tasks) that are still running."""
        with self._lock:
            return self._abandoned

    def start(self) -> None:
        for _ in range(self.concurrency):
            self._spawn()

    def submit(self, attempt: Attempt) -> None:
        """Queue `attempt` for a pool thread. Submitted by a pool thread's own `on_finished`
        while nothing else waits for a thread (a workflow step its parent's success claimed),
        it is kept for that thread to run next, sparing the wake-up of another."""
        self.submit_many((attempt,))

    def submit_many(self, attempts: Sequence[Attempt]) -> None:
        """`submit` each of `attempts`, in order, under one acquisition of the queue's lock."""
        local = self._local
        if attempts and local.finishing and local.next is None and self._queue.empty():
            local.next, attempts = attempts[0], attempts[1:]
        if attempts:
            self._queue.put_many(attempts)

    def hand_off(self, max_s: float = HAND_OFF_MAX_S) -> None:
        """Keep off the GIL until pool threads have taken what was submitted, at most `max_s`.

        For a caller about to block anyway (an idle fetch loop): `submit` wakes a pool thread,
        and if that thread then finds the GIL held it sleeps again until it is released, a
        second wake-up. On a VM whose cores have gone idle that doubled the hand-off of an idle
        worker's pickup (docs/performance.md). The queue empties only once a thread holds the
        job and the GIL: its handler is starting.
        """
        if self._local.finishing:
            return  # a pool thread runs what it kept itself (see `submit`)
        deadline = time.monotonic() + max_s
        while self._queue.untaken() and time.monotonic() < deadline:
            time.sleep(_HAND_OFF_POLL_S)

    def stop(self) -> None:
        """Let every pool thread exit once it is idle; abandoned ones exit when they return.
        The event loop stops with them (the worker has handed back what still ran)."""
        for _ in range(self.concurrency):
            self._queue.put(None)
        self.loop.stop()

    def _spawn(self) -> None:
        name = f"taskline-handler-{next(self._names)}"
        threading.Thread(target=self._work, name=name, daemon=True).start()

    def _work(self) -> None:
        local = self._local
        self._permits.acquire()
        while True:
            attempt = local.next or self._queue.get()
            local.next = None
            if attempt is None:
                self._permits.release()
                return
            if attempt.settled_by is not None:
                # Fenced or handed back before a thread took it: never start its side effects.
                self._on_finished(attempt, None, None, 0.0)
            elif is_async(attempt):
                self._start_async(attempt)  # its task holds this thread's permit now
                self._permits.acquire()
            elif not self._run(attempt):
                return

    def _run(self, attempt: Attempt) -> bool:
        """Run one handler; False when this thread was written off and must end."""
        started = time.monotonic()
        attempt.begin_run()
        timer = self._deadlines.call_at(started + attempt.job.timeout_s,
                                        functools.partial(self._timed_out, attempt, None))
        result: Any = None
        error: BaseException | None = None
        try:
            result = self._call(attempt)
        except BaseException as err:  # a handler's SystemExit must not kill a pool thread
            error = err
        finally:
            self._deadlines.cancel(timer)
        written_off = attempt.end_run()
        if written_off:
            with self._lock:
                self._abandoned -= 1
        self._local.finishing = True
        try:
            self._on_finished(attempt, result, error, time.monotonic() - started)
        finally:
            self._local.finishing = False
        if written_off and self._local.next is not None:
            # This thread ends: its replacement, or another, runs what it kept.
            self._queue.put(self._local.next)
            self._local.next = None
        return not written_off

    def _call(self, attempt: Attempt) -> Any:
        return call_handler(attempt)

    def _start_async(self, attempt: Attempt) -> None:
        """Start a coroutine handler on the loop. Its timeout is armed here, before the loop
        sees it, so a blocked loop cannot delay the timeout of a handler it has not started."""
        running = _Running(attempt, time.monotonic())
        attempt.begin_run()
        running.timer = self._deadlines.call_at(
            running.started + attempt.job.timeout_s,
            functools.partial(self._timed_out, attempt, running))
        running.cancel = self.loop.run(functools.partial(call_async_handler, attempt),
                                       functools.partial(self._async_ended, running))

    def _async_ended(self, running: _Running, result: Any, error: BaseException | None) -> None:
        """A coroutine handler returned, raised or ended cancelled (on the loop's thread)."""
        attempt = running.attempt
        self._deadlines.cancel(running.timer)
        written_off = attempt.end_run()
        if written_off:
            with self._lock:
                self._abandoned -= 1
        try:
            self._on_finished(attempt, result, error, time.monotonic() - running.started)
        finally:
            if not written_off:
                self._permits.release()  # a written-off task gave it back at its timeout

    def _timed_out(self, attempt: Attempt, running: _Running | None) -> None:
        if not attempt.write_off():
            return  # the handler returned while this deadline fired
        with self._lock:
            self._abandoned += 1
            abandoned = self._abandoned
        self._permits.release()
        if running is None:
            self._spawn()
        log.warning("handler abandoned after its timeout", extra=attempt.log_extra(
            "abandon", abandoned_threads=abandoned, coroutine=running is not None))
        self._on_timeout(attempt)
        if running is not None and running.cancel is not None:
            # After the timeout owns the outcome: the task's CancelledError must not be
            # recorded as the handler's failure.
            running.cancel()
        if abandoned > self.concurrency:
            self._on_recycle()
