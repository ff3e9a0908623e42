"""Retention: deletes finished jobs once they are older than their status's retention.

Invariant: only a finished job (succeeded, cancelled, dead) is ever deleted, and only once
`finished_at` (the instant its terminal transition committed, PostgreSQL's clock) is older than
`TASKLINE_RETAIN_<STATUS>_S`; 0 keeps that status forever. A job that is not finished is never
deleted, whatever its age: the statement (`Store.expire_finished`) names the terminal states as
literals and re-checks each row under its lock, so a dead job requeued meanwhile stays. A job is
deleted whole or not at all: the job row, its events, leases and DLQ row go in one statement
(the foreign keys cascade), one short transaction per batch of at most `BATCH_SIZE` jobs. Only
after that commit does Redis forget the ids (the move's step, `Dispatcher.follow`: DLQ entry,
retry and scheduled sets); if this process dies in between, the reconciler removes ids whose job
is absent on a later pass. A deleted job is a 404.

A pass repeats batches, per status, until a batch comes back short (nothing expired is left,
or only rows another transaction holds, which the next pass takes), reading candidates oldest
first through the `jobs_finished` index, never by scanning the table; it stops between batches
when this instance stops leading. Between two batches of one pass it rests as long as the last
batch took (`PACE`), so a backlog (retention switched on, or shortened, over a large history)
takes at most half of one PostgreSQL connection's time instead of all of it while claims and
enqueues share the machine; a pass still deletes several thousand jobs a second, far above
what a steady load finishes. Passes run every tenth of the shortest retention, between one and
ten reaper intervals (`Settings.retention_interval_s`: 50 s by default). After each pass the
gauges say how old the oldest kept job of each status is.

Workflows: no step of an unfinished workflow is deleted (its dependents read their parents'
results), so a dead step with waiting dependents would be kept for ever; once it is past the
dead retention its waiting dependents are cancelled (a purged dead step cancels its dependents),
which finishes the workflow and lets the step go. A workflow row goes once all its steps have.

History by partition (taskline.store.partitions): a deleted job's row goes alone; its events
and leases stay in their partition of `job_events` / `job_leases` until the whole partition
expires. Each pass first creates the partitions missing ahead (`TASKLINE_HISTORY_PARTITIONS_
AHEAD`) and rolls the sequences to a new partition once a day (`TASKLINE_HISTORY_PARTITION_S`),
then expires each closed partition whose newest row is older than the longest of the succeeded
and cancelled windows: it is replaced by a copy of its rows whose job still exists (a dead job
inside its 30 days, an unfinished job), or dropped when none does. Row deletes remain for the
default partitions only (rows no range took). A partition holding a live lease waits.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from taskline import transitions
from taskline.dispatch.dispatcher import Dispatcher
from taskline.jobs import Status
from taskline.metrics import (
    HISTORY_PARTITIONS_AHEAD,
    HISTORY_PARTITIONS_EXPIRED,
    RETENTION_DELETED,
    RETENTION_OLDEST,
    RETENTION_SECONDS,
)
from taskline.mirror import Mirror
from taskline.service import Periodic, always
from taskline.settings import Settings
from taskline.store.partitions import horizon_s
from taskline.store.rows import Deleted
from taskline.store.views import MaintenanceStore
from taskline.transitions import Committed

log = logging.getLogger(__name__)

BATCH_SIZE = 5000
"""Jobs deleted per statement (one transaction): small enough that no batch holds its row
locks for long, large enough that a pass keeps up with a steady load."""
STATUSES = (Status.SUCCEEDED, Status.CANCELLED, Status.DEAD)
PACE = 1.0
"""Rest between two batches of a pass, as a multiple of the last batch's duration."""


@dataclass(frozen=True)
class RetentionResult:
    """Counts of one retention pass."""

    deleted: Mapping[Status, int] = field(default_factory=dict)
    batches: int = 0

    @property
    def changed(self) -> bool:
        return any(self.deleted.values())


class Retention(Periodic):
    """Deletes expired finished jobs in PostgreSQL, batch by batch, then forgets them in Redis."""

    name = "retention"

    def __init__(self, store: MaintenanceStore, dispatcher: Dispatcher, settings: Settings, *,
                 batch_size: int = BATCH_SIZE, active: Callable[[], bool] = always,
                 rest: Callable[[float], object] = time.sleep) -> None:
        super().__init__()
        self.rest = rest
        self.store = store
        self.dispatcher = dispatcher
        self.mirror = Mirror.of(dispatcher, store)
        self.settings = settings
        self.batch_size = batch_size
        self.active = active
        self._exported = False
        for status in STATUSES:  # 0, not "no data", on a dashboard before the first deletion
            RETENTION_DELETED.labels(status=status.value)

    @property
    def interval_s(self) -> float:
        return self.settings.retention_interval_s

    def retention_s(self, status: Status) -> float:
        return self.settings.retention_s[status.value]

    def idle(self) -> None:
        """Only the leader exports the retention gauges: a standby clears what it exported."""
        if self._exported:
            RETENTION_OLDEST.clear()
            RETENTION_SECONDS.clear()
            self._exported = False

    def run_once(self) -> RetentionResult:
        deleted: dict[Status, int] = {}
        batches = 0
        if self.retention_s(Status.DEAD) > 0:
            self._cancel_orphans()
        for status in STATUSES:
            if self.retention_s(status) > 0:
                deleted[status], n = self._expire(status)
                batches += n
        self._delete_empty_workflows()
        try:
            self._partitions()
        except Exception:  # a lock not had, a race with another leader: the next pass retries
            log.warning("history partition upkeep failed; next pass retries", exc_info=True,
                        extra={"action": "partitions"})
        self._export_ages()
        result = RetentionResult(deleted, batches)
        if not result.changed:
            log.debug("retention pass: nothing expired", extra={"action": "retention"})
        return result

    def _expire(self, status: Status) -> tuple[int, int]:
        """(jobs deleted, batches run) for one status, until a batch comes back short."""
        total = batches = 0
        took = 0.0
        while self.active():
            if batches:
                self.rest(PACE * took)
            started = time.monotonic()
            batch = self.store.expire_finished(status, self.retention_s(status), self.batch_size)
            took = time.monotonic() - started
            batches += 1
            total += len(batch)
            self._forget(status, batch)
            if len(batch) < self.batch_size:
                break
        return total, batches

    def _cancel_orphans(self) -> None:
        """A workflow step dead past its retention is purged: first its waiting dependents are
        cancelled, which finishes its workflow, so the step (kept while its workflow is
        unfinished, for parent_results) can go."""
        while True:
            cancelled = self.store.cancel_dependents_of_expired_dead(
                self.retention_s(Status.DEAD), self.batch_size)
            for row in cancelled:
                if row.status is Status.CANCELLED:
                    log.info("waiting step cancelled: its dead parent expired",
                             extra={"action": "cancelled", "job_id": str(row.id),
                                    "queue": row.queue, "cause": "parent_expired"})
            # A `when` step the cancellations decided is queued: pushed, as an unblock.
            self.mirror.follow([Committed(
                transitions.CANCEL if r.status is Status.CANCELLED else transitions.UNBLOCK,
                str(r.id), r.queue, r.priority) for r in cancelled],
                action="cancelled", strict=True)
            if len(cancelled) < self.batch_size or not self.active():
                break

    def _delete_empty_workflows(self) -> None:
        """Workflow rows whose steps are all gone, after the longest retention."""
        longest = max(self.retention_s(status) for status in STATUSES)
        if longest > 0:
            self.store.delete_empty_workflows(longest, self.batch_size)

    def _partitions(self) -> None:
        """Partitions ahead created, the sequences rolled daily, a new partition analyzed,
        expired partitions replaced by their kept rows or dropped, orphans of the default
        partitions deleted."""
        parts = self.store.partitions
        parts.ensure_ahead(self.settings.history_partitions_ahead)
        parts.roll(self.settings.history_partition_s)
        parts.analyze_new()
        horizon = horizon_s(self.settings.retention_s)
        if horizon is not None:
            for part in parts.expirable(horizon):
                if not self.active():
                    break
                kept = parts.expire(part)
                if kept is not None:
                    HISTORY_PARTITIONS_EXPIRED.labels(
                        table=part.table, kind="replaced" if kept else "dropped").inc()
        parts.prune_default(self.batch_size)
        for state in parts.state():
            HISTORY_PARTITIONS_AHEAD.labels(table=state.table).set(state.ahead)

    def _forget(self, status: Status, batch: list[Deleted]) -> None:
        """Count and log the committed deletions, then remove the ids from Redis."""
        if not batch:
            return
        RETENTION_DELETED.labels(status=status.value).inc(len(batch))
        for row in batch:
            # One record per job, as every job-path transition logs: the fault checker judges
            # deletions from these (the row and its history are gone).
            log.info("job expired", extra={"action": "expired", "job_id": str(row.id),
                                           "queue": row.queue, "type": row.type,
                                           "status": row.status.value,
                                           "finished_at": row.finished_at.isoformat()})
        self.mirror.follow([row.committed() for row in batch], action="expired", strict=True)

    def _export_ages(self) -> None:
        ages = self.store.oldest_finished(STATUSES)
        for status in STATUSES:
            RETENTION_OLDEST.labels(status=status.value).set(ages.get(status) or 0.0)
            RETENTION_SECONDS.labels(status=status.value).set(self.retention_s(status))
        self._exported = True
