"""The reaper: gives back the jobs of workers that stopped renewing their leases.

Invariant: a job is recovered when, and only when, its PostgreSQL lease has expired in
PostgreSQL time (`Store.recover_expired` compares `leased_until < now()` inside PostgreSQL,
never a process clock). A missing heartbeat key alone is never a reason to recover a job: after
a Redis restart every key is gone while every worker is alive and renewing, so this module does
not read heartbeat keys at all. Recovery puts the job back to queued (or dead when the expired
attempt was its last, decided by `taskline.transitions.decide_recovery`, the rule a failed
attempt follows too; attempts are counted at claim, so a job that kills its worker every time
still reaches the DLQ), closes the lease as `lost` and writes a `recovered` event, all in one
transaction (a workflow step's death also releasing its `when` dependents there); only then is
the id moved in Redis, by the move's step (`Dispatcher.follow`).
If this process dies between the two, the job is queued (or dead) in PostgreSQL but not where
Redis should hold it, and the reconciler restores it on a later pass. While Redis is
unreachable the pass goes on: workers claiming from PostgreSQL are notified of the requeued
jobs (taskline.readiness), and the rebuild after Redis returns puts the ids back.

Between passes the reaper sleeps its interval, or less: until just after the earliest open
lease's expiry as PostgreSQL computes it (`Store.seconds_to_next_lease_expiry`), so a killed
worker's job is recovered at its lease's end rather than up to one interval later. Waking early
only changes when a pass runs; what a pass recovers is still decided by `leased_until < now()`.

It also closes the registry rows of workers silent for ten heartbeat periods, so
`GET /workers` and the live-worker gauge stop listing them; that is bookkeeping only and never
touches a job.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from taskline.dispatch.dispatcher import Dispatcher
from taskline.metrics import (
    JOB_DLQ,
    JOB_RECOVERED,
    ORDERING_TURNS,
    STEPS_RELEASED,
    LabelGuard,
    TypeLabels,
)
from taskline.mirror import Mirror
from taskline.service import Periodic
from taskline.settings import Settings
from taskline.store.rows import Recovered, turns_passed
from taskline.store.views import MaintenanceStore

log = logging.getLogger(__name__)

PAGE_SIZE = 500
"""Expired leases recovered per transaction; the reaper pages until none are left."""
WAKE_AFTER_EXPIRY_S = 0.02
"""Margin past the earliest expiry, so the pass finds that lease strictly expired."""
MIN_WAIT_S = 0.05
"""Shortest sleep between passes, so a burst of expiries never spins the loop."""
SILENT_HEARTBEATS = 10
"""A worker silent for this many heartbeat periods has its registry row closed."""


@dataclass(frozen=True)
class ReapResult:
    """Counts of one reaper pass."""

    requeued: int = 0
    dead_lettered: int = 0
    workers_stopped: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.requeued or self.dead_lettered or self.workers_stopped)


class Reaper(Periodic):
    """Recovers expired leases (PostgreSQL first, then Redis) and closes silent workers."""

    name = "reaper"

    def __init__(self, store: MaintenanceStore, dispatcher: Dispatcher, settings: Settings, *,
                 page_size: int = PAGE_SIZE, types: Callable[[str], str] | None = None,
                 queues: Callable[[str], str] | None = None) -> None:
        super().__init__()
        self.store = store
        self.dispatcher = dispatcher
        self.mirror = Mirror.of(dispatcher, store)
        self.settings = settings
        self.page_size = page_size
        self.type_label = types or TypeLabels(())
        self.queue_label = queues or LabelGuard()

    @property
    def interval_s(self) -> float:
        return self.settings.reaper_interval_s

    def next_wait(self) -> float:
        """Seconds until just after the earliest open lease expires (PostgreSQL time), at most
        the interval; the interval when no lease is open."""
        remaining = self.store.seconds_to_next_lease_expiry()
        if remaining is None:
            return self.interval_s
        return min(self.interval_s, max(MIN_WAIT_S, remaining + WAKE_AFTER_EXPIRY_S))

    def run_once(self) -> ReapResult:
        requeued = dead = 0
        while True:
            recovered = self.store.recover_expired(self.page_size)
            self._follow(recovered)
            dead += sum(1 for r in recovered if r.dead)
            requeued += sum(1 for r in recovered if not r.dead)
            if len(recovered) < self.page_size:
                break
        silent_s = SILENT_HEARTBEATS * self.settings.heartbeat_s
        stopped = self.store.mark_silent_workers_stopped(silent_s)
        if stopped:
            log.info("closed the registry rows of %d silent workers", len(stopped),
                     extra={"action": "reap", "workers": stopped})
        result = ReapResult(requeued, dead, len(stopped))
        if not result.changed:
            log.debug("reaper pass: nothing expired", extra={"action": "reap"})
        return result

    def _follow(self, recovered: list[Recovered]) -> None:
        """Count and log each recovery, then move the ids in Redis."""
        for r in recovered:
            job = r.expired
            queue = job.queue
            JOB_RECOVERED.labels(queue=self.queue_label(queue), cause="lease_expired").inc()
            extra = {"action": "recovered", "job_id": str(job.id), "queue": queue,
                     "attempt": job.attempts, "worker": job.worker_id, "type": job.type}
            if r.dead:
                JOB_DLQ.labels(type=self.type_label(job.type),
                               queue=self.queue_label(queue)).inc()
                log.error("lease expired on the last attempt: job dead-lettered", extra=extra)
            else:
                log.warning("lease expired: job requeued", extra=extra)
        released = [step.committed() for r in recovered for step in r.settled.released]
        if released:
            STEPS_RELEASED.inc(len(released))
        # Committed: when Redis is unreachable, requeued jobs and released steps reach the
        # workers claiming from PostgreSQL by a notification, and Redis is rebuilt when it
        # returns. The pass goes on.
        # A head dead on its last lease gives its ordering key's turn to the next in line.
        turns = turns_passed(r.settled for r in recovered)
        if turns:
            ORDERING_TURNS.inc(len(turns))
        self.mirror.follow(released + turns + [r.committed() for r in recovered], action="reap")
