"""Heartbeat: the worker's proof of life in the workers table and in Redis, and its slot gauges
(busy, all, and the jobs claimed ahead waiting for a thread) and CPUs, with the runner's health:
the abandoned handlers and how long an async handler has been holding the event loop.

Invariant: a failed heartbeat is logged and never stops the worker. The Redis key lives three
periods, but its absence alone proves nothing (after a Redis restart every key is gone while
every worker lives): the reaper decides on PostgreSQL lease times only.
"""

from __future__ import annotations

import logging

from taskline import affinity
from taskline.dispatch.dispatcher import Dispatcher
from taskline.execution.attempts import Attempts
from taskline.execution.runner import Runner
from taskline.metrics import (
    ABANDONED_HANDLERS,
    BUSY_SLOTS,
    CLAIMED_AHEAD,
    EVENT_LOOP_LAG,
    SLOTS,
    WORKER_CPUS,
)
from taskline.service import Periodic, guarded
from taskline.store.views import WorkerStore

log = logging.getLogger(__name__)


class Heartbeat(Periodic):
    """Beats every `period_s`; `run(stop)` is its loop, `beat()` (`run_once`) one beat."""

    name = "heartbeat"

    def __init__(self, *, store: WorkerStore, dispatcher: Dispatcher, worker_id: str,
                 period_s: float, attempts: Attempts,
                 runner: Runner | None = None) -> None:
        super().__init__()
        self._store = store
        self._dispatcher = dispatcher
        self._worker_id = worker_id
        self._period_s = period_s
        self._attempts = attempts
        self._runner = runner

    @property
    def interval_s(self) -> float:
        return self._period_s

    def run_once(self) -> None:
        self.beat()

    def beat(self) -> None:
        """Each target is beaten on its own: Redis down must not silence the workers table."""
        active = self._attempts.running
        BUSY_SLOTS.labels(self._worker_id).set(active)
        SLOTS.labels(self._worker_id).set(self._attempts.concurrency)
        WORKER_CPUS.labels(self._worker_id).set(affinity.allowed())
        CLAIMED_AHEAD.labels(self._worker_id).set(self._attempts.waiting)
        if self._runner is not None:
            EVENT_LOOP_LAG.labels(self._worker_id).set(self._runner.loop.lag_s())
            ABANDONED_HANDLERS.labels(self._worker_id).set(self._runner.abandoned)
        guarded(self.name, lambda: self._store.heartbeat_worker(self._worker_id, active),
                "workers table")
        guarded(self.name, lambda: self._dispatcher.heartbeat(
            self._worker_id, ttl_s=3 * self._period_s), "Redis key")
