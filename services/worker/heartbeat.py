"""Heartbeat: the worker's proof of life in the workers table and in Redis, and its slot gauges.

Invariant: a failed heartbeat is logged and never stops the worker. The Redis key lives three
periods, but its absence alone proves nothing (after a Redis restart every key is gone while
every worker lives): the reaper decides on PostgreSQL lease times only.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from taskline.dispatch.dispatcher import Dispatcher
from taskline.metrics import BUSY_SLOTS, LOOP_ERRORS, SLOTS
from taskline.store.store import Store
from taskline_worker.attempts import Attempts

log = logging.getLogger(__name__)


class Heartbeat:
    """Beats every `period_s`; `run(stop)` is its loop, `beat()` one beat."""

    def __init__(self, *, store: Store, dispatcher: Dispatcher, worker_id: str,
                 period_s: float, attempts: Attempts) -> None:
        self._store = store
        self._dispatcher = dispatcher
        self._worker_id = worker_id
        self._period_s = period_s
        self._attempts = attempts

    def run(self, stop: threading.Event) -> None:
        while True:
            self.beat()
            if stop.wait(self._period_s):
                return

    def beat(self) -> None:
        active = self._attempts.busy
        BUSY_SLOTS.labels(self._worker_id).set(active)
        SLOTS.labels(self._worker_id).set(self._attempts.concurrency)
        self._guarded("workers table", lambda: self._store.heartbeat_worker(self._worker_id,
                                                                             active))
        self._guarded("Redis key", lambda: self._dispatcher.heartbeat(
            self._worker_id, ttl_s=3 * self._period_s))

    def _guarded(self, what: str, beat: Callable[[], object]) -> None:
        try:
            beat()
        except Exception as err:
            LOOP_ERRORS.labels("heartbeat").inc()
            log.warning("heartbeat failed", extra={"action": "heartbeat", "target": what,
                                                   "worker": self._worker_id,
                                                   "error": f"{type(err).__name__}: {err}"})
