"""Queue-depth gauges, exported by the active maintenance instance only.

Invariant: exactly one process exports the depth gauges at a time, so Prometheus never sums
duplicates: workers and the API never set them, and a maintenance instance clears them as soon
as it is not the leader. Depths are read from Redis (what is dispatchable now), the age of the
oldest queued job, the outbox relay's backlog and the live-worker count from PostgreSQL (in
its own clock). The Redis depths of every queue are read together (Dispatcher.depths_of: one
walk of the keyspace and one pipeline), so a pass costs the keys and the pending jobs, not one
round of Redis calls per queue name.

Interval: every `TASKLINE_REAPER_INTERVAL_S` seconds (5 by default), as often as the reaper.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from taskline import metrics
from taskline.dispatch.dispatcher import Dispatcher
from taskline.dispatch.keys import valid_queue_name
from taskline.metrics import (
    DLQ_DEPTH,
    OLDEST_READY,
    OUTBOX_OLDEST,
    OUTBOX_PENDING,
    PROCESSING_DEPTH,
    QUEUE_DEPTH,
    RETRY_DEPTH,
    SCHEDULED_DEPTH,
    WAITING_DEPTH,
    LabelGuard,
)
from taskline.service import Periodic
from taskline.settings import Settings
from taskline.store.views import MaintenanceStore

log = logging.getLogger(__name__)

LIVE_HEARTBEATS = 3
"""A worker counts as live while its last heartbeat is younger than this many periods."""
_PER_QUEUE = (PROCESSING_DEPTH, RETRY_DEPTH, SCHEDULED_DEPTH, DLQ_DEPTH, OLDEST_READY,
              WAITING_DEPTH)


@dataclass(frozen=True)
class DepthResult:
    """Totals over every queue, as exported."""

    queues: int = 0
    ready: int = 0
    processing: int = 0
    retry: int = 0
    scheduled: int = 0
    dlq: int = 0
    live_workers: int = 0


class DepthGauges(Periodic):
    """Sets the depth gauges from Redis and PostgreSQL; clears them when not leading."""

    name = "depths"

    def __init__(self, store: MaintenanceStore, dispatcher: Dispatcher, settings: Settings, *,
                 queues: Callable[[str], str] | None = None) -> None:
        super().__init__()
        self.store = store
        self.dispatcher = dispatcher
        self.settings = settings
        self.queue_label = queues or LabelGuard()
        self._exported = False

    @property
    def interval_s(self) -> float:
        return self.settings.reaper_interval_s

    def idle(self) -> None:
        """Only the leader exports depths: a standby clears what it exported while leading."""
        self.clear()

    def run_once(self) -> DepthResult:
        names = self.dispatcher.known_queues() | set(self.store.pending_queues())
        queues = sorted(q for q in names if valid_queue_name(q))
        oldest = self.store.oldest_ready()
        waiting = self.store.waiting_counts()
        for q in sorted(set(waiting) | set(queues)):
            if valid_queue_name(q):
                WAITING_DEPTH.labels(queue=self.queue_label(q)).set(waiting.get(q, 0))
        depths = self.dispatcher.depths_of(queues)  # a few round trips for every queue
        totals = [self._export(q, depths[q], oldest.get(q, 0.0)) for q in queues]
        pending, oldest_owed_s = self.store.outbox_backlog()
        OUTBOX_PENDING.set(pending)
        OUTBOX_OLDEST.set(oldest_owed_s)
        live = len(self.store.list_workers(LIVE_HEARTBEATS * self.settings.heartbeat_s))
        metrics.maintenance().live_workers.set(live)
        self._exported = True
        result = DepthResult(len(queues), *(sum(t[i] for t in totals) for i in range(5)), live)
        log.debug("depth gauges updated", extra={"action": "depths", "queues": len(queues)})
        return result

    def _export(self, queue: str, depths: dict[str, object],
                oldest_s: float) -> tuple[int, int, int, int, int]:
        label = self.queue_label(queue)
        ready: dict[int, int] = depths["ready"]  # type: ignore[assignment]
        for priority, n in ready.items():
            QUEUE_DEPTH.labels(queue=label, priority=str(priority)).set(n)
        PROCESSING_DEPTH.labels(queue=label).set(depths["processing"])
        RETRY_DEPTH.labels(queue=label).set(depths["retry"])
        SCHEDULED_DEPTH.labels(queue=label).set(depths["scheduled"])
        DLQ_DEPTH.labels(queue=label).set(depths["dlq"])
        OLDEST_READY.labels(queue=label).set(oldest_s)
        return (sum(ready.values()), int(depths["processing"]), int(depths["retry"]),
                int(depths["scheduled"]), int(depths["dlq"]))

    def clear(self) -> None:
        """Stop exporting: a standby's stale values would be summed with the leader's."""
        if not self._exported:
            return
        QUEUE_DEPTH.clear()
        for gauge in _PER_QUEUE:
            gauge.clear()
        metrics.maintenance().live_workers.set(0)
        OUTBOX_PENDING.set(0)
        OUTBOX_OLDEST.set(0)
        self._exported = False
