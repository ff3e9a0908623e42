"""Handlers and an in-process harness for the worker tests.

The handlers record calls, block on named gates, fail on demand, ignore the stop flag or stop
cooperatively, so each test can put a worker in the exact situation it checks. `running_worker`
runs a real `Worker` (real PostgreSQL and Redis) on a thread and always stops it, releasing
every gate first so no handler thread outlives its test.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import text

from taskline.dispatch.keys import QueueKeys
from taskline.errors import JobCancelled, NonRetryableError
from taskline.handlers.registry import JobContext, handler
from taskline.settings import Settings
from taskline_worker.worker import Exit, Worker

MODULE = __name__
GATE_LIMIT_S = 30.0  # no test handler blocks longer than this, whatever happens

CALLS: list[tuple[str, int]] = []
RUNNING: dict[str, int] = {}  # t.held / t.other handlers running now, by type
PEAK: dict[str, int] = {}  # the most that ran at once, by type
ANY = "*"
"""The RUNNING and PEAK key counting held handlers of every type, threads and coroutines."""
_lock = threading.Lock()
_gates: dict[str, threading.Event] = {}


def gate(name: str) -> threading.Event:
    with _lock:
        return _gates.setdefault(name, threading.Event())


def release(name: str) -> None:
    gate(name).set()


def open_all_gates() -> None:
    """Let every blocked handler return."""
    with _lock:
        for event in _gates.values():
            event.set()


def reset() -> None:
    """Open every gate and forget gates and recorded calls."""
    open_all_gates()
    with _lock:
        _gates.clear()
        CALLS.clear()
        RUNNING.clear()
        PEAK.clear()


def tags() -> list[str]:
    with _lock:
        return [tag for tag, _ in CALLS]


def _record(payload: Any, ctx: JobContext) -> None:
    with _lock:
        CALLS.append((str(payload.get("tag")), ctx.attempt))


@handler("t.record")
def record(payload: Any, ctx: JobContext) -> dict:
    """Remember the call (tag, attempt) and succeed."""
    _record(payload, ctx)
    return {"tag": payload.get("tag"), "attempt": ctx.attempt}


@handler("t.block")
def block(payload: Any, ctx: JobContext) -> dict:
    """Wait for the gate; stop cooperatively (raise JobCancelled) when asked to."""
    g = gate(payload["gate"])
    for _ in range(int(GATE_LIMIT_S / 0.01)):
        if g.wait(0.01):
            return {"released": True}
        if ctx.stopping:
            raise JobCancelled("stopped on request")
    raise TimeoutError("gate never opened")


@handler("t.stubborn")
def stubborn(payload: Any, ctx: JobContext) -> dict:
    """Wait for the gate and ignore the stop flag entirely."""
    gate(payload["gate"]).wait(GATE_LIMIT_S)
    return {"stubborn": True, "stopping": ctx.stopping}


@handler("t.fail")
def fail(payload: Any, ctx: JobContext) -> None:
    raise RuntimeError(payload.get("error", "boom"))


@handler("t.fatal")
def fatal(payload: Any, ctx: JobContext) -> None:
    raise NonRetryableError("cannot ever work")


@handler("t.hook")
def hook(payload: Any, ctx: JobContext) -> dict:
    """Register a hook writing to hook_log in the completion transaction; optionally block."""
    statement = "SELECT 1/0" if payload.get("hook_fails") else (
        "INSERT INTO hook_log (job_id, attempt) VALUES (:job_id, :attempt)")
    ctx.on_complete(lambda conn: conn.execute(text(statement),
                                              {"job_id": ctx.job_id, "attempt": ctx.attempt}))
    if payload.get("gate"):
        gate(payload["gate"]).wait(GATE_LIMIT_S)
    return {"hooked": True}


@handler("t.coalesced")
def coalesced(payload: Any, ctx: JobContext) -> dict:
    """Return every payload the run covers (a debounced job's joined payloads)."""
    return {"coalesced": ctx.coalesced}


class WorkerThread:
    """A real Worker running on a thread, as `taskline worker` runs it on the main one."""

    def __init__(self, settings: Settings, queues: Sequence[str] = ("default",),
                 concurrency: int = 2, block_timeout_s: float = 1.0) -> None:
        settings = settings.replace(handlers=(MODULE,))
        self.worker = Worker(settings, queues, concurrency, block_timeout_s=block_timeout_s)
        self.exit: Exit | None = None
        self.thread = threading.Thread(target=self._run, name="test-worker", daemon=True)

    def _run(self) -> None:
        self.exit = self.worker.run()

    def start(self) -> Worker:
        self.thread.start()
        assert self.worker.started.wait(10), "worker did not start"
        return self.worker

    def stop(self, force: bool = False, timeout: float = 20.0) -> None:
        self.worker.stop(force=force)
        wake = self.worker.dispatcher.client
        for _ in range(int(timeout / 0.1)):
            if not self.thread.is_alive():
                return
            # An idle worker blocks in BLPOP; a marker on its signal lists wakes it at once.
            for queue in self.worker.queues:
                _wake(wake, QueueKeys(queue).signal)
            self.thread.join(0.1)
        raise AssertionError("worker did not stop")


def _wake(client: Any, key: str) -> None:
    with contextlib.suppress(Exception):  # the dispatcher is closed once the worker stopped
        client.lpush(key, "1")


@contextmanager
def running_worker(settings: Settings, **options: Any) -> Iterator[Worker]:
    runner = WorkerThread(settings, **options)
    worker = runner.start()
    try:
        yield worker
    finally:
        open_all_gates()
        if runner.thread.is_alive():
            runner.stop()


@handler("t.other")
@handler("t.held")
def held(payload: Any, ctx: JobContext) -> dict:
    """Record the call, count how many of its type run at once, and sleep `sleep_s` (50 ms)."""
    _record(payload, ctx)
    enter(ctx.type)
    try:
        gate(payload.get("gate", "never-closed")).wait(float(payload.get("sleep_s", 0.05)))
    finally:
        leave(ctx.type)
    return {"tag": payload.get("tag")}


def enter(job_type: str) -> None:
    """Count a handler of `job_type` running, and under ANY every counted handler."""
    with _lock:
        for key in (job_type, ANY):
            RUNNING[key] = RUNNING.get(key, 0) + 1
            PEAK[key] = max(PEAK.get(key, 0), RUNNING[key])


def leave(job_type: str) -> None:
    with _lock:
        for key in (job_type, ANY):
            RUNNING[key] -= 1


# The coroutine handlers register with these, in every worker the harness runs.
from tests.integration import async_handlers  # noqa: E402, F401
