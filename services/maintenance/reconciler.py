"""The reconciler: repairs drift between Redis (the dispatch index) and PostgreSQL (the truth).

Invariant: after a pass, every job that was pending or dead in PostgreSQL since before the pass
began is where Redis should hold it (queued: a ready or processing list; retrying and
scheduled: their set; dead: the DLQ list), and Redis holds no id whose job is absent or
finished, except entries created by changes that raced the pass, which the next pass settles.
Nothing here can lose or double-run a job: PostgreSQL's conditional claim admits one winner
per attempt, so a duplicate id only costs a failed claim, and a removed id whose job is still
pending is restored by the next pass.

Cost is linear in the pending jobs, memory is bounded by one page, and no list is scanned per
id. Per queue:
  a. Snapshot: `before = PostgreSQL now() - grace` is read first, then one Lua call copies every
     id of the ready and processing lists into a Redis set, another the retry and scheduled
     sets, another the DLQ list. The grace keeps jobs a live producer, worker or the promoter
     has committed but not pushed yet (milliseconds, normally) from being taken as missing.
  b. Missing: pending jobs last changed before `before` are paged from PostgreSQL by id (5,000
     a page) and tested against the snapshot with one SMISMEMBER per page; missing queued ids
     are pushed, missing retrying and scheduled ids re-added to their set with their due
     time. Dead jobs are checked against the DLQ snapshot the same way. Ids found are taken
     out of the working set (same round trip), so (c) looks only at what (b) did not confirm.
     After a Redis loss the order inside a priority is by id, not by age: PostgreSQL keeps no
     dispatch order.
  c. Garbage: what is left of the snapshots is walked in chunks (SSCAN); ids whose job is
     absent or finished are gathered in a working set and removed from the ready lists by one
     Lua pass per list (only when there are any). Ids of jobs cancelled while pending are
     gathered apart and counted as stale, not as drift: a cancel leaves its ready-list copies
     for the claim to refuse, so finding them says nothing about Redis losing or mangling
     data. Retry and scheduled entries of jobs no longer waiting are removed (ZREM is by
     member); DLQ entries of jobs that are not dead are removed the same way as ready entries.
  d. Processing lists (short: a worker's in-flight ids) are read whole. Ids of absent or
     finished jobs and of jobs waiting for a retry or a delayed run are removed; an id running
     under another worker's lease is a duplicate and removed; a queued id is stranded (a lost
     LMOVE reply, or a worker that died between fetch and claim) if it is still queued and
     still in that list after a short pause, and is then moved back to ready.
  e. Partitions at or above TASKLINE_QUEUE_PARTITIONS (left by a larger setting): their
     ready, retry, scheduled and DLQ ids are pushed to their home partition first, then
     removed from the old one (a worker fetching one meanwhile only makes a duplicate the
     claim refuses); a partition left empty leaves the queues set.
  f. The working sets are deleted (they also expire, so a crashed pass leaves nothing).

With TASKLINE_QUEUE_PARTITIONS > 1 steps a - d run per partition (each partition's keys share
one cluster slot); an id found in any partition is present.

Workflow steps waiting for their parents (`waiting`) are in no Redis structure: (b) never
restores one (it pages pending states only), and (c) and (d) remove one found in a ready or
processing list. The success that releases a step queues it in PostgreSQL before its push, so
a push lost to a crash is restored by (b) like any other queued job.

The promoter's crash window (jobs moved to queued in PostgreSQL, not yet pushed) is repaired
by (b): queued jobs are checked against ready and processing lists only, so an id left in a
retry or scheduled set does not hide it, and (c) then drops that stale set entry.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from taskline import metrics
from taskline.dispatch.dispatcher import Dispatcher
from taskline.dispatch.keys import QueueKeys, partition_of_key, valid_queue_name
from taskline.jobs import MAX_PRIORITY, MIN_PRIORITY, REDIS_HOME, RedisHome, Status
from taskline.metrics import (
    RECONCILE_CORRUPTED,
    RECONCILE_MISSING,
    RECONCILE_MOVED,
    RECONCILE_STALE,
    LabelGuard,
)
from taskline.service import Periodic, always
from taskline.settings import Settings
from taskline.store.views import MaintenanceStore

log = logging.getLogger(__name__)

GRACE_S = 5.0
"""Jobs changed less than this long before a pass are not judged missing by it, seconds."""
PAGE_SIZE = 5000
"""Jobs read from PostgreSQL, and ids tested in Redis, per round trip."""
SNAPSHOT_TTL_S = 600
"""Lifetime of a pass's working sets, seconds, in case the pass dies before deleting them."""
MAX_STRAND_PAUSE_S = 1.0
"""Longest wait before a queued id found in a processing list is judged stranded, seconds."""
_FIRST_ID = uuid.UUID(int=0)


@dataclass(frozen=True)
class ReconcileResult:
    """Counts of one pass by kind: `missing` ids restored to Redis (queued, retrying,
    scheduled, dead) and `corrupted` entries removed or moved (ready, retry, scheduled, dlq,
    processing, duplicate, stranded)."""

    missing: Mapping[str, int]
    corrupted: Mapping[str, int]
    duration_s: float
    stale: int = 0
    """Ready-list ids of jobs cancelled while pending: removed, expected, not drift."""
    moved: int = 0
    """Ids moved out of partitions at or above TASKLINE_QUEUE_PARTITIONS: expected after a
    change of the setting, not drift."""

    @property
    def changed(self) -> bool:
        return (any(self.missing.values()) or any(self.corrupted.values()) or bool(self.stale)
                or bool(self.moved))


class _Tally:
    """Counts by (queue, kind), published to the metrics once the pass ends."""

    def __init__(self) -> None:
        self.missing: Counter[tuple[str, str]] = Counter()
        self.corrupted: Counter[tuple[str, str]] = Counter()
        self.stale: Counter[str] = Counter()
        self.moved: Counter[str] = Counter()

    def publish(self, label: Callable[[str], str]) -> None:
        for (queue, kind), n in self.missing.items():
            RECONCILE_MISSING.labels(queue=label(queue), kind=kind).inc(n)
        for (queue, kind), n in self.corrupted.items():
            RECONCILE_CORRUPTED.labels(queue=label(queue), kind=kind).inc(n)
        for queue, n in self.stale.items():
            RECONCILE_STALE.labels(queue=label(queue)).inc(n)
        for queue, n in self.moved.items():
            RECONCILE_MOVED.labels(queue=label(queue)).inc(n)

    def result(self, duration_s: float) -> ReconcileResult:
        return ReconcileResult(_by_kind(self.missing), _by_kind(self.corrupted), duration_s,
                               sum(self.stale.values()), sum(self.moved.values()))


def _by_kind(counts: Counter[tuple[str, str]]) -> dict[str, int]:
    totals: Counter[str] = Counter()
    for (_queue, kind), n in counts.items():
        totals[kind] += n
    return {kind: n for kind, n in totals.items() if n}


@dataclass(frozen=True)
class _Snapshot:
    """The working sets of one pass over one queue; the token keeps passes apart."""

    keys: QueueKeys
    token: str
    sizes: dict[str, int] = field(default_factory=dict, compare=False)
    """Ids each working set held when taken; a set that was empty is not asked again."""

    def _name(self, part: str) -> str:
        return self.keys.snapshot(f"{self.token}:{part}")

    @property
    def ready(self) -> str:
        return self._name("ready")

    @property
    def delayed(self) -> str:
        return self._name("delayed")

    @property
    def dlq(self) -> str:
        return self._name("dlq")

    @property
    def drop(self) -> str:
        return self._name("drop")

    @property
    def dlq_drop(self) -> str:
        return self._name("dlq-drop")

    @property
    def stale_drop(self) -> str:
        return self._name("stale-drop")

    def all(self) -> list[str]:
        return [self.ready, self.delayed, self.dlq, self.drop, self.dlq_drop, self.stale_drop]


@dataclass(frozen=True)
class _Suspect:
    """A queued id found in a processing list: stranded unless it moves on by itself."""

    queue: str
    owner: str
    job_id: str
    partition: int = 0


def _home(row) -> RedisHome:
    """Where Redis should hold this job's id (taskline.jobs.REDIS_HOME); absent: nowhere."""
    return RedisHome.NONE if row is None else REDIS_HOME[row.status]


def _unready(row) -> bool:
    """Absent, finished, or a workflow step still waiting for its parents: no ready or
    processing list may hold it (a waiting step's release pushes it)."""
    return _home(row) in (RedisHome.NONE, RedisHome.DLQ)


def _cancelled(row) -> bool:
    return row is not None and row.status == Status.CANCELLED


def _processing_verdict(row, owner: str) -> str | None:
    """What an id in `owner`'s processing list is: a kind to remove, 'stranded', or None."""
    if _home(row) not in (RedisHome.READY, RedisHome.PROCESSING):
        return "processing"
    if row.status == Status.RUNNING and row.lease_worker not in (None, owner):
        return "duplicate"
    if row.status == Status.QUEUED:
        return "stranded"
    return None


class Reconciler(Periodic):
    """Restores pending jobs Redis lost and removes Redis entries PostgreSQL does not back."""

    name = "reconciler"

    def __init__(self, store: MaintenanceStore, dispatcher: Dispatcher, settings: Settings, *,
                 grace_s: float = GRACE_S, page_size: int = PAGE_SIZE,
                 strand_pause_s: float | None = None,
                 queues: Callable[[str], str] | None = None) -> None:
        super().__init__()
        self.store = store
        self.dispatcher = dispatcher
        self.settings = settings
        self.grace_s = grace_s
        self.page_size = page_size
        self.strand_pause_s = (min(MAX_STRAND_PAUSE_S, settings.reconcile_interval_s / 4)
                               if strand_pause_s is None else strand_pause_s)
        self.queue_label = queues or LabelGuard()
        self._stop = threading.Event()
        self._passing = threading.Lock()  # the periodic pass and a rebuild never overlap
        self._lists: dict[str, list[str]] = {}
        """The pass's processing lists per queue (Dispatcher.processing_lists_of)."""

    @property
    def interval_s(self) -> float:
        return self.settings.reconcile_interval_s

    def run(self, stop: threading.Event, active: Callable[[], bool] = always) -> None:
        """A pass as soon as this instance leads (so at start-up), then every interval."""
        self._stop = stop
        super().run(stop, active)

    def run_once(self) -> ReconcileResult:
        with self._passing:
            return self._pass(self.grace_s)

    def rebuild(self) -> ReconcileResult:
        """A pass without grace, right after Redis came back or lost its content: every job
        queued before it began is pushed, also one whose producer could not push it a moment
        ago. A producer pushing the same id too only makes a duplicate, refused at claim."""
        with self._passing:
            return self._pass(0.0)

    def _pass(self, grace_s: float) -> ReconcileResult:
        started = time.perf_counter()
        tally = _Tally()
        before = self.store.now() - timedelta(seconds=grace_s)
        token = uuid.uuid4().hex[:12]
        snaps: dict[str, list[_Snapshot]] = {}
        try:
            for queue in self._queues():
                self._snapshot(snaps, queue, token)
            self._restore_pending(snaps, token, before, tally)
            self._restore_dead(snaps, token, before, tally)
            for lanes in list(snaps.values()):
                for snap in lanes:
                    self._remove_garbage(snap, tally)
            self._repair_processing(list(snaps), tally)
            for queue in list(snaps):
                self._move_retired(queue, token, tally)
        finally:
            for lanes in snaps.values():  # one DEL per partition: its keys share one slot
                for snap in lanes:
                    self.dispatcher.delete(snap.all())
        return self._finish(tally, time.perf_counter() - started)

    def _finish(self, tally: _Tally, duration_s: float) -> ReconcileResult:
        metrics.maintenance().reconcile_duration.observe(duration_s)
        tally.publish(self.queue_label)
        result = tally.result(duration_s)
        extra = {"action": "reconcile", "missing": dict(result.missing),
                 "corrupted": dict(result.corrupted), "stale": result.stale,
                 "moved": result.moved, "duration": round(duration_s, 3)}
        if result.missing or result.corrupted:
            log.warning("reconciliation repaired drift between Redis and PostgreSQL",
                        extra=extra)
        elif result.stale or result.moved:
            log.info("reconciliation removed ready-list ids of cancelled jobs or moved ids "
                     "out of retired partitions", extra=extra)
        else:
            log.debug("reconciliation pass: Redis matches PostgreSQL", extra=extra)
        return result

    def _queues(self) -> list[str]:
        """The queues to snapshot: those holding pending jobs in PostgreSQL, and those Redis
        knows that hold anything there. A queue known to Redis but empty in both costs only
        its share of one pipeline (a queue found later, among the dead jobs, is snapshotted
        then), so a pass grows with the jobs, not with every queue name ever used."""
        pending = set(self.store.pending_queues())
        names = pending | self.dispatcher.known_queues()
        invalid = sorted(n for n in names if not valid_queue_name(n))
        if invalid:
            log.warning("ignoring invalid queue names found in Redis: %s", invalid[:10],
                        extra={"action": "reconcile"})
        valid = sorted(n for n in names if valid_queue_name(n))
        self._lists = self.dispatcher.processing_lists_of(valid)
        idle = [q for q in valid if q not in pending and not self._lists[q]]
        depths = self.dispatcher.depths_of(idle, self._lists)
        empty = {q for q, d in depths.items() if not _holds_any(d)}
        return [q for q in valid if q not in empty]

    # --- a. snapshot ---------------------------------------------------------------------

    def _snapshot(self, snaps: dict[str, list[_Snapshot]], queue: str, token: str
                  ) -> list[_Snapshot]:
        """Take `queue`'s snapshots, one per partition, unless this pass has them already
        (queues found late too)."""
        if queue in snaps:
            return snaps[queue]
        lanes = snaps[queue] = []
        lists = self._processing_lists(queue)
        for partition in self.dispatcher.partitions_of(queue):
            snap = _Snapshot(QueueKeys(queue, partition), token)
            lanes.append(snap)
            keys = snap.keys
            processing = [key for key in lists if partition_of_key(key) == partition]
            for dest, sources in ((snap.ready, [*keys.ready_by_urgency, *processing]),
                                  (snap.delayed, [keys.retry, keys.scheduled]),
                                  (snap.dlq, [keys.dlq])):
                snap.sizes[dest] = self.dispatcher.snapshot(dest, sources, SNAPSHOT_TTL_S)
        return lanes

    def _processing_lists(self, queue: str) -> list[str]:
        """A queue's processing lists, as found for every queue at the pass's start."""
        if queue not in self._lists:
            self._lists[queue] = self.dispatcher.processing_lists(queue)
        return self._lists[queue]

    # --- b. missing ----------------------------------------------------------------------

    def _pages(self, fetch: Callable[[uuid.UUID, datetime, int], list],
               before: datetime) -> Iterator[list]:
        """Keyset pages (by id) of a query, so memory stays at one page."""
        after = _FIRST_ID
        while True:
            rows = fetch(after, before, self.page_size)
            if rows:
                yield rows
            if len(rows) < self.page_size:
                return
            after = rows[-1].id

    def _restore_pending(self, snaps: dict[str, list[_Snapshot]], token: str,
                         before: datetime, tally: _Tally) -> None:
        for rows in self._pages(self.store.pending_page, before):
            for queue, group in _by_queue(rows).items():
                lanes = self._snapshot(snaps, queue, token)
                queued = [r for r in group if r.status == Status.QUEUED]
                waiting = [r for r in group if r.status != Status.QUEUED]
                lost = (self._absent(lanes, "ready", queued)
                        + self._absent(lanes, "delayed", waiting))
                self._push_back(queue, lost, tally)

    def _absent(self, lanes: Sequence[_Snapshot], kind: str, rows: Sequence) -> list:
        """The rows whose id no partition's working set of `kind` holds. Ids found are taken
        out of the set: their job is pending (or dead) as expected, so the garbage walk (c)
        need not ask again."""
        rows = list(rows)
        for snap in lanes:
            key = getattr(snap, kind)
            if not rows:
                break
            if not snap.sizes.get(key):
                continue
            present = self.dispatcher.take(key, [str(r.id) for r in rows])
            rows = [row for row, here in zip(rows, present, strict=True) if not here]
        return rows

    def _push_back(self, queue: str, rows: Sequence, tally: _Tally) -> None:
        queued = [(queue, r.priority, str(r.id)) for r in rows if r.status == Status.QUEUED]
        self.dispatcher.push(queued)
        tally.missing[(queue, "queued")] += len(queued)
        for status, retry in ((Status.RETRYING, True), (Status.SCHEDULED, False)):
            entries = [(str(r.id), r.due_ms) for r in rows if r.status == status]
            self.dispatcher.schedule_many(queue, entries, retry=retry)
            tally.missing[(queue, status.value)] += len(entries)

    def _restore_dead(self, snaps: dict[str, list[_Snapshot]], token: str, before: datetime,
                      tally: _Tally) -> None:
        for rows in self._pages(self.store.dead_page, before):
            for queue, group in _by_queue(rows).items():
                lanes = self._snapshot(snaps, queue, token)
                lost = [str(r.id) for r in self._absent(lanes, "dlq", group)]
                self.dispatcher.restore_dead(queue, lost)
                tally.missing[(queue, "dead")] += len(lost)

    # --- c. garbage ----------------------------------------------------------------------

    def _remove_garbage(self, snap: _Snapshot, tally: _Tally) -> None:
        queue, keys = snap.keys.queue, snap.keys
        drop, stale = self._gather_ready(snap)
        if drop:
            tally.corrupted[(queue, "ready")] += self.dispatcher.discard(
                snap.drop, keys.ready_by_urgency)
        if stale:
            tally.stale[queue] += self.dispatcher.discard(snap.stale_drop, keys.ready_by_urgency)
        for ids in self.dispatcher.scan_set(snap.delayed):
            found = self.store.statuses(ids)
            stale = [i for i in ids if _home(found.get(i)) is not RedisHome.DELAYED]
            retry, scheduled = self.dispatcher.unschedule_many(queue, stale,
                                                               partition=keys.partition)
            tally.corrupted[(queue, "retry")] += retry
            tally.corrupted[(queue, "scheduled")] += scheduled
        if self._gather(snap.dlq, snap.dlq_drop,
                        lambda row: row is not None and row.status == Status.DEAD):
            tally.corrupted[(queue, "dlq")] += self.dispatcher.discard(snap.dlq_drop, [keys.dlq])

    def _gather_ready(self, snap: _Snapshot) -> tuple[bool, bool]:
        """Ready-list ids of finished or absent jobs into `drop`, those of cancelled jobs into
        `stale_drop`; whether each got any."""
        dropped = stale = False
        for ids in self.dispatcher.scan_set(snap.ready):
            found = self.store.statuses(ids)
            cancelled = [i for i in ids if _cancelled(found.get(i))]
            doomed = [i for i in ids if _unready(found.get(i)) and not _cancelled(found.get(i))]
            self.dispatcher.collect(snap.stale_drop, cancelled, SNAPSHOT_TTL_S)
            self.dispatcher.collect(snap.drop, doomed, SNAPSHOT_TTL_S)
            dropped, stale = dropped or bool(doomed), stale or bool(cancelled)
        return dropped, stale

    def _gather(self, source: str, drop: str, keep: Callable[[object], bool]) -> bool:
        """Collect the ids of `source` whose row `keep` rejects into `drop`; True if any."""
        gathered = False
        for ids in self.dispatcher.scan_set(source):
            found = self.store.statuses(ids)
            doomed = [i for i in ids if not keep(found.get(i))]
            self.dispatcher.collect(drop, doomed, SNAPSHOT_TTL_S)
            gathered = gathered or bool(doomed)
        return gathered

    # --- d. processing lists -------------------------------------------------------------

    def _repair_processing(self, queues: Sequence[str], tally: _Tally) -> None:
        suspects: list[_Suspect] = []
        for queue in queues:
            by_partition: dict[int, list[str]] = defaultdict(list)
            for key in self._processing_lists(queue):
                by_partition[partition_of_key(key)].append(key)
            for partition, lists in sorted(by_partition.items()):
                keys = QueueKeys(queue, partition)
                for key in lists:
                    suspects += self._check_processing(keys, key, tally)
                # Workers whose list is gone (emptied) leave the registry; a fetch adds them
                # back.
                self.dispatcher.forget_holders(queue, [keys.worker_of(key) for key in lists],
                                               partition)
        # A live worker holds a fetched id for the milliseconds before its claim: only an id
        # still queued and still in the list after the pause is stranded.
        if suspects and not self._stop.wait(self.strand_pause_s):
            self._requeue_stranded(suspects, tally)

    def _check_processing(self, keys: QueueKeys, key: str, tally: _Tally) -> list[_Suspect]:
        owner = keys.worker_of(key)
        ids = list(dict.fromkeys(self.dispatcher.list_range(key, 0, -1)))
        found = self.store.statuses(ids)
        verdicts: dict[str, list[str]] = defaultdict(list)
        for job_id in ids:
            verdict = _processing_verdict(found.get(job_id), owner)
            if verdict is not None:
                verdicts[verdict].append(job_id)
        for kind in ("processing", "duplicate"):
            tally.corrupted[(keys.queue, kind)] += self.dispatcher.remove_all(
                key, verdicts[kind])
        return [_Suspect(keys.queue, owner, job_id, keys.partition)
                for job_id in verdicts["stranded"]]

    def _requeue_stranded(self, suspects: Sequence[_Suspect], tally: _Tally) -> None:
        found = self.store.statuses([s.job_id for s in suspects])
        for s in suspects:
            row = found.get(s.job_id)
            if row is None or row.status != Status.QUEUED:
                continue
            # if_present: the id moves only if it is still in that worker's list.
            if self.dispatcher.requeue(s.queue, row.priority, s.job_id, from_worker=s.owner,
                                       always=False, partition=s.partition):
                tally.corrupted[(s.queue, "stranded")] += 1
                log.warning("stranded id returned to ready", extra={
                    "action": "reconcile", "job_id": s.job_id, "queue": s.queue,
                    "worker": s.owner})


    # --- e. retired partitions -----------------------------------------------------------

    def _move_retired(self, queue: str, token: str, tally: _Tally) -> None:
        """Move what partitions at or above N hold to the ids' home partitions; forget a
        partition left empty. Pushed first, removed after: never absent from Redis."""
        for partition in self.dispatcher.partitions_of(queue):
            if partition < self.dispatcher.partitions:
                continue
            keys = QueueKeys(queue, partition)
            drop = keys.snapshot(f"{token}:moved")
            try:
                moved = self._move_lists(keys, drop) + self._move_delayed(keys)
            finally:
                self.dispatcher.delete([drop])
            tally.moved[queue] += moved
            lists = [k for k in self._processing_lists(queue) if partition_of_key(k) == partition]
            if not _holds_any(self.dispatcher.depths_in(keys, lists)):
                self.dispatcher.forget_partition(queue, partition)

    def _move_lists(self, keys: QueueKeys, drop: str) -> int:
        moved = 0
        for priority in range(MAX_PRIORITY, MIN_PRIORITY - 1, -1):
            ids = self.dispatcher.list_range(keys.ready(priority), 0, -1)
            if ids:  # LRANGE lists the newest first; pushed oldest first, they keep their order
                self.dispatcher.push([(keys.queue, priority, i) for i in reversed(ids)])
                self.dispatcher.collect(drop, ids, SNAPSHOT_TTL_S)
                moved += self.dispatcher.discard(drop, [keys.ready(priority)])
                self.dispatcher.delete([drop])
        dead = self.dispatcher.list_range(keys.dlq, 0, -1)
        if dead:
            self.dispatcher.restore_dead(keys.queue, list(reversed(dead)))
            self.dispatcher.collect(drop, dead, SNAPSHOT_TTL_S)
            moved += self.dispatcher.discard(drop, [keys.dlq])
        return moved

    def _move_delayed(self, keys: QueueKeys) -> int:
        entries = self.dispatcher.delayed_entries(keys.queue, keys.partition)
        for retry in (True, False):
            self.dispatcher.schedule_many(
                keys.queue, [(i, due) for i, due, r in entries if r is retry], retry=retry)
        retry_n, scheduled_n = self.dispatcher.unschedule_many(
            keys.queue, [i for i, _, _ in entries], partition=keys.partition)
        return retry_n + scheduled_n


def _holds_any(depths: dict[str, object]) -> bool:
    """Whether a queue's Redis structures hold anything (Dispatcher.depths)."""
    ready: dict[int, int] = depths["ready"]  # type: ignore[assignment]
    return bool(sum(ready.values()) or depths["processing"] or depths["retry"]
                or depths["scheduled"] or depths["dlq"])


def _by_queue(rows: Sequence) -> dict[str, list]:
    groups: dict[str, list] = defaultdict(list)
    for row in rows:
        groups[row.queue].append(row)
    return groups
