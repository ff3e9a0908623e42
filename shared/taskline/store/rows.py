"""Typed rows of the store's transition statements, and the settlements they take.

Invariant: a statement that moves jobs returns frozen dataclasses built with `from_row`, each
able to say which committed transition it records (`committed()`), so callers never compare a
tuple's status with a string literal and the Redis step after it is chosen from the move.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from taskline import transitions
from taskline.fingerprint import fingerprint
from taskline.jobs import Status
from taskline.store.params import CANONICAL_UUID
from taskline.transitions import Committed, Move, Transition

CONDITION_UNMET = "condition_unmet"
"""The cause of an `any_failed` workflow step's cancellation when every parent succeeded."""


@dataclass(frozen=True)
class Settlement:
    """One attempt to end: its lease, the worker that holds it, and how it ends."""

    lease_id: int
    worker_id: str
    transition: Transition
    releases: bool = False
    """The job is a workflow step: its success (or, for `when` dependents, its death or
    cancellation) may release waiting dependents, so the store settles its batch with
    `settle_releasing` (settle and the release in one statement)."""

    def to_input(self, *, lapsed: bool) -> dict[str, Any]:
        """The settle statement's input row (see store/sql/attempts.sql `settle`)."""
        t, move = self.transition, self.transition.move
        return {"lease_id": self.lease_id, "worker_id": self.worker_id,
                "status": move.target.value, "outcome": t.outcome.value if t.outcome else None,
                "event": move.event.value, "error": t.error, "result": t.result,
                "writes_result": move.writes_result, "writes_error": move.writes_error,
                "delay_s": t.delay_s, "detail": dict(t.detail) if t.detail else None,
                "refund": int(move.refunds_attempt), "snooze": int(move.counts_snooze),
                "dead_letter": move.dead_letter,
                "fingerprint": fingerprint(t.error) if move.dead_letter else None,
                "finishes": move.finishes, "lapsed": lapsed, "releases": self.releases}


@dataclass(frozen=True)
class Settled:
    """A job whose attempt `settle` ended: the state it reached and where Redis holds it."""

    id: uuid.UUID
    queue: str
    priority: int
    attempts: int
    status: Status
    lease_id: int
    worker_id: str
    due_ms: int | None
    released: tuple[Released, ...] = ()
    """Waiting steps this settlement's transaction queued (on one row of a batch: a child of
    several parents in the batch is released once, by all of them together)."""
    unmet: int = 0
    """any_failed steps the transaction cancelled as condition_unmet (on the same row)."""
    turn: Turn | None = None
    """The queued job of the same ordering key this settlement gave the turn to (it finished
    the key's head): pushed after the commit."""

    @classmethod
    def from_row(cls, row: Any) -> Settled:
        turn_id = getattr(row, "turn_id", None)
        return cls(id=row.id, queue=row.queue, priority=row.priority, attempts=row.attempts,
                   status=Status(row.status), lease_id=row.lease_id, worker_id=row.worker_id,
                   due_ms=None if row.due_ms is None else int(row.due_ms),
                   turn=None if turn_id is None else Turn(turn_id, row.queue,
                                                          int(row.turn_priority)))

    def committed(self, move: Move) -> Committed:
        return Committed(move, str(self.id), self.queue, self.priority, self.worker_id,
                         self.due_ms)


@dataclass(frozen=True)
class Released:
    """A waiting workflow step queued because its last parents succeeded."""

    id: uuid.UUID
    queue: str
    priority: int

    @classmethod
    def from_row(cls, row: Any) -> Released:
        return cls(id=row.id, queue=row.queue, priority=row.priority)

    def committed(self) -> Committed:
        return Committed(transitions.UNBLOCK, str(self.id), self.queue, self.priority)


@dataclass(frozen=True)
class Turn:
    """A queued job of an ordering key whose previous head finished in the same statement."""

    id: uuid.UUID
    queue: str
    priority: int

    def committed(self) -> Committed:
        return Committed(transitions.TURN, str(self.id), self.queue, self.priority)


def turns_passed(rows: Iterable[Settled]) -> list[Committed]:
    """The keys' next heads these settlements gave the turn to, to push after the commit."""
    return [row.turn.committed() for row in rows if row.turn is not None]


@dataclass(frozen=True)
class Expired:
    """A live lease past its time, its job locked for the reaper's decision."""

    lease_id: int
    worker_id: str
    id: uuid.UUID
    queue: str
    priority: int
    type: str
    attempts: int
    max_retries: int
    workflow_id: uuid.UUID | None = None

    @classmethod
    def from_row(cls, row: Any) -> Expired:
        return cls(lease_id=row.lease_id, worker_id=row.worker_id, id=row.id, queue=row.queue,
                   priority=row.priority, type=row.type, attempts=row.attempts,
                   max_retries=row.max_retries, workflow_id=getattr(row, "workflow_id", None))

    def settlement(self) -> Settlement:
        """Recovered by the same rule as a failed attempt: dead once retries are exhausted (a
        workflow step's death then releases its `when` dependents in the same statement)."""
        return Settlement(self.lease_id, self.worker_id,
                          transitions.decide_recovery(self.attempts, self.max_retries,
                                                      self.worker_id),
                          releases=self.workflow_id is not None)


@dataclass(frozen=True)
class Recovered:
    """A job the reaper took back from an expired lease."""

    expired: Expired
    transition: Transition
    settled: Settled

    @property
    def dead(self) -> bool:
        return self.settled.status is Status.DEAD

    def committed(self) -> Committed:
        return self.settled.committed(self.transition.move)


@dataclass(frozen=True)
class Promoted:
    """A scheduled or retrying job the promoter made queued."""

    id: uuid.UUID
    queue: str
    priority: int
    attempts: int

    @classmethod
    def from_row(cls, row: Any) -> Promoted:
        return cls(id=row.id, queue=row.queue, priority=row.priority, attempts=row.attempts)

    def committed(self) -> Committed:
        return Committed(transitions.PROMOTE, str(self.id), self.queue, self.priority)


@dataclass(frozen=True)
class Deleted:
    """A finished job retention deleted, with its events, leases and DLQ row."""

    id: uuid.UUID
    queue: str
    type: str
    status: Status
    finished_at: datetime

    @classmethod
    def from_row(cls, row: Any) -> Deleted:
        return cls(id=row.id, queue=row.queue, type=row.type, status=Status(row.status),
                   finished_at=row.finished_at)

    def committed(self) -> Committed:
        return Committed(transitions.EXPIRE, str(self.id), self.queue, left=self.status)


@dataclass(frozen=True)
class DeadChanged:
    """A dead job a bulk operation changed by `move`: requeued (REQUEUE), or deleted with its
    events, leases and DLQ row (PURGE)."""

    id: uuid.UUID
    queue: str
    priority: int
    type: str
    move: Move
    released: tuple[Released, ...] = ()
    """`when` workflow steps a purge's cancellations queued (on the last row of a batch)."""

    @classmethod
    def from_row(cls, row: Any, move: Move) -> DeadChanged:
        return cls(id=row.id, queue=row.queue, priority=row.priority, type=row.type, move=move)

    def committed(self) -> Committed:
        return Committed(self.move, str(self.id), self.queue, self.priority, left=Status.DEAD)

    def follows(self) -> list[Committed]:
        """The Redis steps after its commit: the steps it released, then its own move."""
        return [*(step.committed() for step in self.released), self.committed()]


@dataclass(frozen=True)
class StepCounts:
    """A workflow's steps by status, and its any_failed steps cancelled as condition_unmet."""

    by_status: dict[str, int]
    unmet: int


@dataclass(frozen=True)
class ScheduleRow:
    """A row of `schedules`, with PostgreSQL's clock when it was read."""

    name: str
    cron: str
    timezone: str
    job: dict[str, Any]
    paused: bool
    catch_up: str
    since: datetime
    revision: int
    last_slot: datetime | None
    last_job_id: uuid.UUID | None
    created_at: datetime | None
    updated_at: datetime | None
    db_now: datetime
    declared_in_code: bool | None = None
    """True while the code maintenance last started with declares it (`@periodic`), false once
    declared in code and no longer, None for a schedule never declared in code."""

    @classmethod
    def from_row(cls, row: Any) -> ScheduleRow:
        return cls(name=row.name, cron=row.cron, timezone=row.timezone, job=row.job,
                   paused=getattr(row, "paused", False), catch_up=row.catch_up,
                   since=row.since, revision=int(row.revision), last_slot=row.last_slot,
                   last_job_id=getattr(row, "last_job_id", None),
                   created_at=getattr(row, "created_at", None),
                   updated_at=getattr(row, "updated_at", None), db_now=row.db_now,
                   declared_in_code=getattr(row, "declared_in_code", None))


_STATUSES = {status.value: status for status in Status}
"""A status by its name: a dict lookup, where `Status(name)` runs the enum's lookup in Python."""
_OWED_MOVES = {status: transitions.CREATED[status] for status in (Status.QUEUED, Status.SCHEDULED)}
"""The creating move Redis may owe an outbox row's job, by the job's status now."""

KEYED_ANNOUNCEMENT = "keyed "
"""How an announcement of a job with an ordering key begins (enqueue_in_transaction)."""


@dataclass(frozen=True)
class Owed:
    """An outbox row: a job committed inside an application's transaction that Redis may not
    hold yet, with its job's state now (`status` None: the job is gone).

    Its id is kept as text, the form Redis is given and the outbox delete is sent: the relay
    reads it so from each announcement, and a `uuid.UUID` made of it and turned back into text
    cost a fifth of the relay's CPU per job (docs/performance.md, change 118)."""

    job_id: str
    queue: str
    priority: int | None
    status: Status | None
    due_ms: int | None
    keyed: bool = False
    """The job has an ordering key: pushed only as its key's head."""

    @classmethod
    def of(cls, fields: Mapping[str, Any]) -> Owed:
        """An outbox row from its fields' values, as `Job.of` builds a job: one dict update
        instead of the frozen __init__'s object.__setattr__ per field. The relay builds one
        per job an application enqueues, where that __init__ was a quarter of reading the
        job's announcement (docs/performance.md, change 114)."""
        owed = object.__new__(cls)
        owed.__dict__.update(fields)
        return owed

    @classmethod
    def from_row(cls, row: Any) -> Owed:
        due = row.next_run_at
        return cls.of({"job_id": str(row.job_id), "queue": row.queue, "priority": row.priority,
                       "status": None if row.status is None else Status(row.status),
                       "due_ms": None if due is None else round(due.timestamp() * 1000),
                       "keyed": bool(getattr(row, "keyed", False))})

    @classmethod
    def from_announcement(cls, payload: str) -> Owed | None:
        """The job a `taskline_enqueued_jobs` signal announces ("<id> <priority> <status>
        <due ms> <queue>", as enqueue_in_transaction writes it, after "keyed " for a job with
        an ordering key); None when it is not one. A relay of an earlier release reads a keyed
        announcement as none (its first word is no id) and drains the outbox for it instead."""
        keyed = payload.startswith(KEYED_ANNOUNCEMENT)
        parts = payload[len(KEYED_ANNOUNCEMENT) if keyed else 0:].split(" ", 4)
        if len(parts) != 5:
            return None
        job_id, priority, status, due_ms, queue = parts
        if CANONICAL_UUID.fullmatch(job_id) is None:
            return None
        try:
            return cls.of({"job_id": job_id, "queue": queue,
                           "priority": int(priority), "status": _STATUSES[status],
                           "due_ms": int(due_ms), "keyed": keyed})
        except (ValueError, KeyError):
            return None

    def committed(self) -> Committed | None:
        """The creating move Redis still owes this job, or None when it no longer waits to
        start (claimed already, cancelled, deleted): its row is then simply forgotten. A job
        promoted since is queued and pushed like a new one; a second copy is dropped at claim."""
        move = _OWED_MOVES.get(self.status)  # None too: the job is gone
        if move is None or self.priority is None:
            return None
        return Committed.of({"move": move,
                             "job_id": self.job_id, "queue": self.queue,
                             "priority": self.priority, "due_ms": self.due_ms})
