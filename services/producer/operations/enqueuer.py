"""Accepting jobs: write them to PostgreSQL, commit, and only then hand their ids to Redis.

Invariant: a job and its first event are written by one INSERT statement (a batch's jobs by one
statement for all of them; single enqueues without keys that wait at the same moment, by one
statement for all of them, taskline_producer.operations.grouping), atomic by itself, and no request
is answered before the statement holding its job committed. It commits alone (autocommit, one round
trip) unless it is a batch with idempotency keys, whose replay check may refuse the batch
after part of it was inserted: that runs in one transaction, rolled back whole. (The store
writes a large batch without keys by COPY instead, also in one transaction:
taskline.store.bulk.) Redis hears of a job only after the commit, so Redis never holds an id
PostgreSQL does not. A failed push after the commit loses nothing: the job is durable, the
workers claiming from PostgreSQL while Redis is out are notified (taskline.readiness), and the
rebuild after Redis returns (or reconciliation) pushes it. An idempotency key names one
request body per queue: the unique index makes concurrent duplicates insert one row, and a
replay with another body is refused.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any

from sqlalchemy import Connection

from taskline import uniqueness
from taskline.dispatch.dispatcher import Dispatcher
from taskline.errors import IdempotencyConflict, StoreUnavailable
from taskline.jobs import Job, Status, new_job_id, visible_key
from taskline.jobspec import JobSpec
from taskline.log import job_fields as job_log_extra
from taskline.mirror import Mirror
from taskline.store import caller
from taskline.store.store import STATEMENT_ERRORS
from taskline.store.views import ApiStore
from taskline.transitions import CREATED, Committed
from taskline_producer.operations.grouping import GroupWriter
from taskline_producer.operations.job_metrics import JobMetrics

log = logging.getLogger(__name__)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Accepted:
    """A job the API answers with, and whether this request created it or replayed it."""

    job: Job
    created: bool
    duplicate: bool = False
    """A unique key's job in scope was returned (or, with `replaced`, rewritten)."""
    replaced: bool = False
    debounced: bool = False
    """The request joined the debounced job waiting out its delay."""

    @classmethod
    def created_job(cls, job: Job) -> Accepted:
        """`Accepted(job, created=True)`, a plain job just inserted, built as Job.of builds a
        job: the frozen __init__ sets each of the five fields through object.__setattr__, once
        per job of every batch; the three flags keep their class defaults."""
        accepted = object.__new__(cls)
        accepted.__dict__.update(job=job, created=True)
        return accepted

    def flags(self) -> Mapping[str, bool]:
        """What the answer says beside the job: `duplicate`, `replaced`, `debounced`."""
        if not (self.duplicate or self.replaced or self.debounced):
            return _NO_FLAGS  # a plain job's answer: nothing to look up
        return {name: True for name in ("duplicate", "replaced", "debounced")
                if getattr(self, name)}


_NO_FLAGS: Mapping[str, bool] = MappingProxyType({})


def initial_status(spec: JobSpec, db_now: datetime | None) -> Status:
    """Scheduled when the first run lies in the future (by PostgreSQL's clock), else queued."""
    if spec.run_at is not None and db_now is not None:
        return Status.SCHEDULED if spec.run_at > db_now else Status.QUEUED
    return Status.SCHEDULED if spec.delay_s > 0 else Status.QUEUED


def _row(spec: JobSpec, db_now: datetime | None, trace_context: str | None,
         actor: str | None) -> dict[str, Any]:
    """The insert fields of one spec, with a fresh id; `actor` goes on its first event."""
    return {"id": new_job_id(), "type": spec.type, "queue": spec.queue, "payload": spec.payload,
            "priority": spec.priority, "status": initial_status(spec, db_now),
            "max_retries": spec.max_retries, "timeout_s": spec.timeout_s,
            "run_at": spec.run_at, "delay_s": spec.delay_s,
            "idempotency_key": spec.idempotency_key, "request_hash": spec.request_hash,
            "trace_context": trace_context, "actor": actor, "limit_key": spec.limit_key,
            "ordering_key": spec.ordering_key, "tags": spec.tags,
            "expires_at": spec.expires_at, "start_within_s": spec.start_within_s}


def _job(row: dict[str, Any], stored: Any) -> Job:
    """The Job just inserted: the fields it was inserted with, plus those PostgreSQL set."""
    return Job.of({
        "id": stored.id, "type": row["type"], "queue": row["queue"], "payload": stored.payload,
        "priority": row["priority"], "status": row["status"], "attempts": 0,
        "max_retries": row["max_retries"], "timeout_s": float(row["timeout_s"]),
        "next_run_at": stored.next_run_at, "idempotency_key": row["idempotency_key"],
        "last_error": None, "result": None, "created_at": stored.created_at,
        "updated_at": stored.updated_at, "cancel_requested": False,
        "trace_context": row["trace_context"], "limit_key": row["limit_key"],
        "ordering_key": row["ordering_key"], "tags": row["tags"],
        # Without start_within_s the expiry is the instant given, if any: no call per job.
        "expires_at": row["expires_at"] if row["start_within_s"] is None
        else _expiry(row, stored.created_at)})


def _expiry(row: dict[str, Any], created_at: datetime) -> datetime | None:
    """The insert's expiry: the instant given, or its statement's now() + start_within_s."""
    within = row["start_within_s"]
    return row["expires_at"] or (None if within is None
                                 else created_at + timedelta(seconds=within))


def needs_transaction(specs: Sequence[JobSpec]) -> bool:
    """Whether accepting `specs` may have to undo an insert: only a batch holding keys.

    Without keys no job is skipped and none refused, so the one insert statement is the
    whole write. A single job whose key exists inserted nothing, so refusing it (422) has
    nothing to undo either. In a batch with keys, a replay check may refuse the batch after
    other jobs of it were inserted: that needs a transaction to roll back.
    """
    return len(specs) > 1 and any(s.idempotency_key is not None for s in specs)


def lock_order(specs: Sequence[JobSpec]) -> list[int]:
    """The indexes of `specs` in the order their keys are locked.

    Keys are taken in one global order, so two batches sharing keys cannot deadlock; jobs
    without keys lock nothing shared, so they keep their own order.
    """
    if all(s.idempotency_key is None for s in specs):
        return list(range(len(specs)))
    return sorted(range(len(specs)), key=lambda i: (specs[i].queue, specs[i].idempotency_key or ""))


@functools.lru_cache(maxsize=256)
def due_ms(when: datetime) -> int:
    """Epoch ms of `when`, rounded like PostgreSQL's `(extract(epoch ...) * 1000)::bigint`.

    Cached: a batch's jobs share one due time (its statement's now()), and the result depends
    on the instant alone, which is what equal aware datetimes share."""
    micros = (when - _EPOCH) // timedelta(microseconds=1)
    return (micros + 500) // 1000 if micros >= 0 else -((-micros + 500) // 1000)


class Enqueuer:
    """Inserts jobs with their first events, commits, then makes the new ones dispatchable."""

    def __init__(self, store: ApiStore, dispatcher: Dispatcher, metrics: JobMetrics,
                 max_payload_bytes: int = 1_048_576) -> None:
        self._store = store
        self._max_bytes = max_payload_bytes
        self._dispatcher = dispatcher
        self._mirror = Mirror.of(dispatcher, store)
        self._metrics = metrics
        self.group: GroupWriter[dict[str, Any], Job] = GroupWriter(
            self._write_group, item_errors=STATEMENT_ERRORS,
            sizes=metrics.grouped)

    def enqueue(self, spec: JobSpec, trace_context: str | None = None,
                actor: str | None = None) -> Accepted:
        """One job. Without an idempotency key it is written together with the single enqueues of
        other requests waiting at the same moment (taskline_producer.operations.grouping); a keyed
        one alone, as a batch of one, so no two writes ever contend for a key."""
        if spec.idempotency_key is not None or spec.keyed:
            return self.enqueue_many([spec], trace_context, actor)[0]
        db_now = self._store.now() if spec.run_at is not None else None
        job = self.group.submit(_row(spec, db_now, trace_context, actor))
        self._record([job])
        return Accepted.created_job(job)

    def _write_group(self, rows: Sequence[dict[str, Any]]) -> list[Job]:
        """Insert rows without keys (none is skipped) in one autocommit statement, then push."""
        stored = {r.id: r for r in self._store.insert_jobs_with_events(rows)}
        jobs = [_job(row, stored[row["id"]]) for row in rows]
        self._dispatch(jobs)
        return jobs

    def enqueue_many(self, specs: Sequence[JobSpec], trace_context: str | None = None,
                     actor: str | None = None) -> list[Accepted]:
        """All of `specs` or none of them; IdempotencyConflict rolls the whole call back.

        `trace_context` (taskline.tracing) is stored with every job this call creates, and
        `actor` (who asked) on each one's first event.
        """
        if uniqueness.keyed(specs):
            return self._enqueue_keyed(specs, trace_context, actor)
        db_now = self._store.now() if any(s.run_at is not None for s in specs) else None
        order = lock_order(specs)
        ordered = [specs[i] for i in order]
        rows = [_row(spec, db_now, trace_context, actor) for spec in ordered]
        if needs_transaction(specs):
            with self._store.transaction() as conn:
                in_order = self._insert(conn, ordered, rows)
        else:
            in_order = self._insert(None, ordered, rows)
        by_index = dict(zip(order, in_order, strict=True))
        accepted = [by_index[i] for i in range(len(specs))]
        created = [a.job for a in accepted if a.created]
        self._dispatch(created)
        self._record(created)
        return accepted

    def _insert(self, conn: Connection | None, specs: Sequence[JobSpec],
                rows: list[dict[str, Any]]) -> list[Accepted]:
        """One statement inserts the jobs with their first events; replays looked up by key.

        Without `conn` (see needs_transaction) every statement runs in autocommit.
        """
        stored = {r.id: r for r in self._store.insert_jobs_with_events(rows, conn)}
        return [Accepted.created_job(_job(row, stored[row["id"]])) if row["id"] in stored
                else self._replay(conn, spec) for row, spec in zip(rows, specs, strict=True)]

    def _enqueue_keyed(self, specs: Sequence[JobSpec], trace_context: str | None,
                       actor: str | None) -> list[Accepted]:
        """A batch holding a job with unique or debounce: every job of it written under the
        keys' locks in one transaction (taskline.uniqueness), then Redis follows each move."""
        context = uniqueness.Context(max_queues=self._store.max_queues,
                                     max_bytes=self._max_bytes, announce=False,
                                     trace_context=trace_context, actor=actor)
        with self._store.transaction() as conn:
            written = caller.drive(conn, uniqueness.write(specs, context), self._store.schema)
        self._follow(written)
        self._record([w.job for w in written if w.created])
        for w in written:
            outcome = ("replaced" if w.replaced else "duplicate" if w.duplicate
                       else "joined" if w.debounced else None)
            if outcome is not None:
                self._metrics.folded(w.job.type, w.job.queue, outcome)
        return [Accepted(w.job, w.created, w.duplicate, w.replaced, w.debounced)
                for w in written]

    def _follow(self, written: Sequence[uniqueness.Written]) -> None:
        """Redis follows the committed moves: new jobs pushed or scheduled, a joined job's new
        due time mirrored, a replaced queued job pushed at its new priority."""
        moves = [(w.move, w.job) for w in written if w.move is not None]
        self._dispatch([job for _, job in moves],
                       [Committed(move, str(job.id), job.queue, job.priority,
                                  due_ms=None if job.next_run_at is None
                                  else due_ms(job.next_run_at)) for move, job in moves])

    def _record(self, created: Sequence[Job]) -> None:
        """Count the new jobs (one increment per type and queue) and log each when INFO is on."""
        for (job_type, queue), count in Counter((j.type, j.queue) for j in created).items():
            self._metrics.accepted(job_type, queue, count)
        tagged = [j.queue for j in created if j.tags]
        if tagged:
            for queue, count in Counter(tagged).items():
                self._metrics.tagged(queue, count)
        if log.isEnabledFor(logging.INFO):
            for job in created:
                log.info("job accepted", extra=job_log_extra(CREATED[job.status].event, job))

    def _replay(self, conn: Connection | None, spec: JobSpec) -> Accepted:
        """The key exists in this queue: the same body gets the same job, another body fails."""
        key = spec.idempotency_key or ""
        found = self._store.get_job_and_hash_by_key(spec.queue, key, conn)
        if found is None:
            # ON CONFLICT waited for the other insert to commit, so its row is visible here.
            raise RuntimeError(f"idempotency key {key!r} conflicted but no job holds it")
        job, digest = found
        if digest != spec.request_hash:
            raise IdempotencyConflict(f"idempotency key {visible_key(key)!r} was used for job "
                                      f"{job.id} with a different body")
        return Accepted(job, created=False)

    def _dispatch(self, jobs: Sequence[Job], committed: list[Committed] | None = None) -> None:
        if committed is None:
            committed = [Committed.of({
                "move": CREATED[j.status], "job_id": str(j.id), "queue": j.queue,
                "priority": j.priority,
                "due_ms": None if j.next_run_at is None else due_ms(j.next_run_at)})
                for j in jobs]
        # Committed: when Redis cannot take the ids, workers claiming from PostgreSQL are
        # notified and the rebuild after Redis returns pushes them.
        self._mirror.follow(self._heads_only(jobs, committed), action="enqueue")

    def _heads_only(self, jobs: Sequence[Job], committed: list[Committed]) -> list[Committed]:
        """Leave out the new keyed jobs behind their key's head: pushed now, each would be
        fetched, refused and acked away; its turn's push brings it when its time comes.

        Judged after the commit: a head that finished before this read is seen finished (this
        job is pushed), and one that finishes after it saw this job in its settle statement
        (which pushes it). Only a settle whose statement began before this commit and ended
        after this read misses it; the budgeted claim's look, within a second of that end,
        finds it then (taskline_worker.held), and the reconciler restores a head Redis lost.
        """
        keyed = [str(j.id) for j in jobs
                 if j.ordering_key is not None and j.status is Status.QUEUED]
        if not keyed:
            return committed
        try:
            heads = self._store.keyed_heads_among(keyed)
        except StoreUnavailable:
            return committed  # pushed all: the claim refuses those behind their head
        behind = set(keyed) - heads
        return [c for c in committed if c.job_id not in behind]
