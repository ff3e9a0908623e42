"""The job lifecycle: every transition a job can make, named once, in one pure table.

Invariant: a state change is a `Transition`, and a `Transition` is built only by the
constructors below (`succeeded`, `retry`, `dead`, `recovered`, `handed_back`, ...), each of
which takes its target status, history event, lease outcome, DLQ row and Redis step from its
`Move` in `MOVES`. So an inconsistent (status, event, outcome, DLQ row) cannot be written: the
store executes what a constructor built, fencing on the move's `sources`, and the dispatcher
chooses the Redis step after the commit from the move's `step`. "Retries exhausted" is decided
here once (`exhausted`), for failed attempts and for leases the reaper finds expired alike.

No I/O: the worker, the reaper, the API and the unit tests call the same functions.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from taskline.jobs import PENDING, TERMINAL, Backoff, Event, Outcome, Status


class Step(enum.StrEnum):
    """What Redis must do once a transition has committed in PostgreSQL."""

    NONE = "none"
    PUSH = "push"  # onto its ready list
    SCHEDULE = "schedule"  # into the scheduled set, until due
    PROMOTE = "promote"  # from the retry or scheduled set onto its ready list
    ACK = "ack"  # out of the worker's processing list
    RETRY_LATER = "retry_later"  # processing list -> retry set, scored by its due time
    DEAD_LETTER = "dead_letter"  # processing list -> DLQ list
    REQUEUE = "requeue"  # processing list -> head of its ready list
    UNSCHEDULE = "unschedule"  # out of the retry and scheduled sets
    UNDEAD = "undead"  # out of the DLQ list, onto its ready list
    FORGET = "forget"  # a deleted job: out of the DLQ list and the retry and scheduled sets


class Gone(enum.StrEnum):
    """Where a job is once its row is deleted: a pseudo-state that no row holds, so `Status`
    (the states a row can hold, and the API can filter by) stays as it is. A deleted job is a
    404; its events, leases, DLQ row and Redis entries went with it."""

    DELETED = "deleted"


@dataclass(frozen=True)
class Move:
    """One kind of transition: from which states, to which state, recorded how."""

    name: str
    sources: frozenset[Status]
    """The states the job must be in; empty for the moves that create it."""
    target: Status | Gone
    event: Event
    step: Step
    outcomes: frozenset[Outcome] = frozenset()
    """How the attempt's lease may end; empty when the move ends no attempt."""
    refunds_attempt: bool = False
    """The ended attempt is not counted (a hand-back at shutdown, a snooze)."""
    counts_snooze: bool = False
    """The job's `snoozes` grows by one (the handler snoozed it)."""
    writes_result: bool = False
    writes_error: bool = True

    @property
    def ends_attempt(self) -> bool:
        return bool(self.outcomes)

    @property
    def finishes(self) -> bool:
        """The move makes the job finished: it sets `finished_at`, which retention counts from."""
        return self.target in TERMINAL

    @property
    def dead_letter(self) -> bool:
        """The move writes the job's dead_letter_jobs row."""
        return self.target is Status.DEAD

    @property
    def source_names(self) -> list[str]:
        """`sources` as the text array the store's statements fence on, in a stable order."""
        return sorted(s.value for s in self.sources)


_RUNNING = frozenset({Status.RUNNING})
_FAILED = frozenset({Outcome.FAILED, Outcome.TIMEOUT})

ENQUEUE = Move("enqueue", frozenset(), Status.QUEUED, Event.ENQUEUED, Step.PUSH)
SCHEDULE = Move("schedule", frozenset(), Status.SCHEDULED, Event.SCHEDULED, Step.SCHEDULE)
PROMOTE = Move("promote", frozenset({Status.SCHEDULED, Status.RETRYING}), Status.QUEUED,
               Event.PROMOTED, Step.PROMOTE)
CLAIM = Move("claim", frozenset({Status.QUEUED}), Status.RUNNING, Event.CLAIMED, Step.NONE)
SUCCEED = Move("succeed", _RUNNING, Status.SUCCEEDED, Event.SUCCEEDED, Step.ACK,
               frozenset({Outcome.SUCCEEDED}), writes_result=True)
RETRY = Move("retry", _RUNNING, Status.RETRYING, Event.RETRY_SCHEDULED, Step.RETRY_LATER,
             _FAILED)
DEAD = Move("dead", _RUNNING, Status.DEAD, Event.DEAD_LETTERED, Step.DEAD_LETTER, _FAILED)
RECOVER = Move("recover", _RUNNING, Status.QUEUED, Event.RECOVERED, Step.REQUEUE,
               frozenset({Outcome.LOST}))
RECOVER_DEAD = Move("recover_dead", _RUNNING, Status.DEAD, Event.RECOVERED, Step.DEAD_LETTER,
                    frozenset({Outcome.LOST}))
HAND_BACK = Move("hand_back", _RUNNING, Status.QUEUED, Event.RELEASED, Step.REQUEUE,
                 frozenset({Outcome.RELEASED}), refunds_attempt=True, writes_error=False)
SNOOZE = Move("snooze", _RUNNING, Status.SCHEDULED, Event.SNOOZED, Step.RETRY_LATER,
               frozenset({Outcome.SNOOZED}), refunds_attempt=True, writes_error=False,
               counts_snooze=True)
"""The handler raised `taskline.Snooze(delay_s)`: scheduled again for `delay_s`, the attempt not
counted; an ordering key's job keeps its place meanwhile."""
STOP_CANCELLED = Move("stop_cancelled", _RUNNING, Status.CANCELLED, Event.CANCELLED, Step.ACK,
                      frozenset({Outcome.CANCELLED}))
CANCEL = Move("cancel", PENDING | {Status.WAITING}, Status.CANCELLED, Event.CANCELLED,
              Step.UNSCHEDULE)
REQUEST_CANCEL = Move("request_cancel", _RUNNING, Status.RUNNING, Event.CANCEL_REQUESTED,
                      Step.NONE)
PROGRESS = Move("progress", _RUNNING, Status.RUNNING, Event.PROGRESS, Step.NONE)
"""A running handler reported progress (`ctx.progress`): written under its lease, at most once a
second; the job stays running."""
LAPSE = Move("lapse", PENDING, Status.CANCELLED, Event.LAPSED, Step.UNSCHEDULE)
"""A job not started by its `expires_at` (maintenance's lapser, in PostgreSQL's clock); the
claim rule already refuses it. A running job is not affected."""
REQUEUE = Move("requeue", frozenset({Status.DEAD}), Status.QUEUED, Event.REQUEUED, Step.UNDEAD)
EXPIRE = Move("expire", TERMINAL, Gone.DELETED, Event.EXPIRED, Step.FORGET)
"""Retention deletes a job finished longer ago than its status's retention, with its events,
leases and DLQ row (taskline_maintenance.retention); only a finished job, whatever its age."""
WAIT = Move("wait", frozenset(), Status.WAITING, Event.WAITING, Step.NONE)
"""A workflow step with parents is created waiting: in PostgreSQL only, never in Redis."""
UNBLOCK = Move("unblock", frozenset({Status.WAITING}), Status.QUEUED, Event.UNBLOCKED, Step.PUSH)
"""The last parent of a waiting step succeeded: the step is queued in the transaction that
records that success (the store's `settle_releasing`), then pushed onto its ready list."""

TURN = Move("turn", frozenset({Status.QUEUED}), Status.QUEUED, Event.ENQUEUED, Step.PUSH)
"""An ordering key's turn passed to a queued job: the statement that finished the key's head
(succeeded, dead, cancelled while running) found this job next in line, and it is pushed onto
its ready list after the commit, so a worker claims it through the ordinary claim at once. Not
a transition: the job stays queued and no event is written (`event` is never recorded), so it
is not in MOVES."""

PURGE = Move("purge", frozenset({Status.DEAD}), Gone.DELETED, Event.PURGED, Step.FORGET)
"""An operator deletes a dead job from the DLQ (POST /api/v1/dlq/purge), with its events,
leases and DLQ row, as retention would; only a dead one."""

JOIN = Move("join", frozenset({Status.SCHEDULED}), Status.SCHEDULED, Event.JOINED,
            Step.SCHEDULE)
"""A debounced arrival joined the job waiting out its delay: its run time moved (the scheduled
set's mirror follows); the state stays."""
REPLACE_SCHEDULED = Move("replace_scheduled", frozenset({Status.SCHEDULED}), Status.SCHEDULED,
                         Event.REPLACED, Step.SCHEDULE)
REPLACE_QUEUED = Move("replace_queued", frozenset({Status.QUEUED}), Status.QUEUED,
                      Event.REPLACED, Step.PUSH)
"""A unique enqueue replaced a job that had not started: payload and priority (and a scheduled
one's run time) rewritten, the state kept; a queued one is pushed at its new priority (the
claim drops the stale entry)."""

MOVES: Mapping[str, Move] = MappingProxyType({m.name: m for m in (
    ENQUEUE, SCHEDULE, PROMOTE, CLAIM, SUCCEED, RETRY, DEAD, RECOVER, RECOVER_DEAD, HAND_BACK,
    SNOOZE, STOP_CANCELLED, CANCEL, REQUEST_CANCEL, PROGRESS, LAPSE, REQUEUE, EXPIRE, PURGE,
    WAIT, UNBLOCK, JOIN, REPLACE_SCHEDULED, REPLACE_QUEUED)})


CREATED: Mapping[Status, Move] = MappingProxyType(
    {m.target: m for m in MOVES.values() if not m.sources})
"""The move that creates a job in each state a job can start in (queued, scheduled, waiting)."""
FIRST_EVENTS: Mapping[str, str] = MappingProxyType(
    {status.value: move.event.value for status, move in CREATED.items()})
"""A new job's status -> its first event, as the insert statements look it up."""


def _table() -> Mapping[tuple[Status | None, Event], frozenset[Status | Gone]]:
    table: dict[tuple[Status | None, Event], set[Status | Gone]] = {}
    for move in MOVES.values():
        for source in move.sources or {None}:
            table.setdefault((source, move.event), set()).add(move.target)
    return MappingProxyType({key: frozenset(targets) for key, targets in table.items()})


TABLE = _table()
"""(state before, event) -> the states the job can be in after it. One state for every pair
but (running, recovered): the reaper's recovery ends queued, or dead after a last attempt, and
its event row records which (`detail.status`). `expired` leads to the pseudo-state
`deleted` (`Gone.DELETED`): the row and its history are gone; so does `purged`."""


def _status_after_event() -> Mapping[Event, Status | Gone | None]:
    after: dict[Event, set[Status | Gone]] = {}
    for move in MOVES.values():
        if move.sources != {move.target}:  # a move that leaves the state as it was moves nowhere
            after.setdefault(move.event, set()).add(move.target)
    return MappingProxyType({e: next(iter(t)) if len(t) == 1 else None for e, t in after.items()})


STATUS_AFTER = _status_after_event()
"""The state each moving event leaves its job in; None where the event's row says which
(`recovered`). Events absent from it (`cancel_requested`) move the job nowhere."""


def status_after(event: str, recorded: str | None = None) -> str | None:
    """The job's state right after `event`; `recorded` is the state the event's row names
    (`detail.status`), which decides where the event alone does not. None: not a move."""
    try:
        known = STATUS_AFTER[Event(event)]
    except (KeyError, ValueError):
        # A move that keeps the state (joined, replaced) names it in its row; cancel_requested
        # names none and stays unknown.
        return _kept(event, recorded)
    if known is not None:
        return known.value
    try:
        return Status(recorded).value
    except ValueError:
        return None


def _kept(event: str, recorded: str | None) -> str | None:
    """The state a row of a state-keeping move records, when that move may keep it."""
    try:
        state, move = Status(recorded), Event(event)
    except ValueError:
        return None
    return state.value if TABLE.get((state, move)) == {state} else None


def expirable(status: Status) -> bool:
    """Whether retention may delete a job in `status`: only a finished one."""
    return status in EXPIRE.sources


@dataclass(frozen=True)
class Transition:
    """One move of one job, with the values it writes. Build it with a constructor below."""

    move: Move
    outcome: Outcome | None = None
    error: str | None = None
    result: Any = None
    delay_s: float | None = None
    detail: Mapping[str, Any] | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        if (self.outcome is None) == self.move.ends_attempt or (
                self.outcome is not None and self.outcome not in self.move.outcomes):
            raise ValueError(f"{self.move.name} cannot end an attempt as {self.outcome}")
        if (self.delay_s is not None) != (self.move in (RETRY, SNOOZE)):
            raise ValueError("only a retry or a snooze has a delay")

    @property
    def target(self) -> Status | Gone:
        return self.move.target

    @property
    def event(self) -> Event:
        return self.move.event


def succeeded(result: Any) -> Transition:
    return Transition(SUCCEED, Outcome.SUCCEEDED, result=result)


def retry(error: str, delay_s: float, *, outcome: Outcome = Outcome.FAILED, reason: str,
          detail: Mapping[str, Any] | None = None) -> Transition:
    detail = {**(detail or {}), "outcome": outcome.value, "reason": reason,
              "delay_s": round(delay_s, 3)}
    return Transition(RETRY, outcome, error=error, delay_s=max(delay_s, 0.0), detail=detail,
                      reason=reason)


def dead(error: str, *, outcome: Outcome = Outcome.FAILED, reason: str,
         detail: Mapping[str, Any] | None = None) -> Transition:
    detail = {**(detail or {}), "outcome": outcome.value, "reason": reason}
    return Transition(DEAD, outcome, error=error, detail=detail, reason=reason)


def recovered(worker_id: str, *, last: bool) -> Transition:
    """A lease the reaper found expired: queued again, or dead when it was the last attempt."""
    move = RECOVER_DEAD if last else RECOVER
    return Transition(move, Outcome.LOST,
                      error=f"lease expired: worker {worker_id} stopped renewing",
                      detail={"cause": "lease_expired", "status": move.target.value},
                      reason="retries exhausted" if last else "lease expired")


def handed_back() -> Transition:
    return Transition(HAND_BACK, Outcome.RELEASED)


def snoozed(delay_s: float) -> Transition:
    return Transition(SNOOZE, Outcome.SNOOZED, delay_s=max(delay_s, 0.0),
                      detail={"delay_s": round(delay_s, 3)}, reason="snoozed by handler")


def decide_snooze(snoozes: int, max_snoozes: int, delay_s: float) -> Transition:
    """A snooze, unless the job already snoozed `max_snoozes` times: then dead, with the cause."""
    if snoozes >= max_snoozes:
        return dead(f"snoozed more than TASKLINE_MAX_SNOOZES ({max_snoozes}) times",
                    outcome=Outcome.FAILED, reason="snoozes exhausted")
    return snoozed(delay_s)


def cancelled_while_running(error: str) -> Transition:
    return Transition(STOP_CANCELLED, Outcome.CANCELLED, error=error)


def exhausted(attempts: int, max_retries: int) -> bool:
    """Attempts are counted at claim: a job runs at most 1 + max_retries times."""
    return attempts > max_retries


def decide_retry(attempts: int, max_retries: int, backoff: Backoff, error: str, *,
                 outcome: Outcome = Outcome.FAILED, retryable: bool = True,
                 delay_override_s: float | None = None, rng: random.Random | None = None,
                 detail: Mapping[str, Any] | None = None) -> Transition:
    """A failed attempt's transition: a retry on backoff while attempts remain, else dead."""
    if not retryable:
        return dead(error, outcome=outcome, reason="non-retryable error", detail=detail)
    if exhausted(attempts, max_retries):
        return dead(error, outcome=outcome, detail=detail,
                    reason=f"retries exhausted after {attempts} attempts")
    if delay_override_s is not None:
        return retry(error, delay_override_s, outcome=outcome, detail=detail,
                     reason="retry requested by handler")
    return retry(error, backoff.delay(attempts, rng), outcome=outcome, detail=detail,
                 reason="retry with backoff")


def decide_recovery(attempts: int, max_retries: int, worker_id: str) -> Transition:
    """An expired lease's transition, by the same rule as a failed attempt's."""
    return recovered(worker_id, last=exhausted(attempts, max_retries))


@dataclass(frozen=True)
class Committed:
    """A transition PostgreSQL has committed, with what Redis needs to follow it."""

    move: Move
    job_id: str
    queue: str
    priority: int = 0
    worker_id: str | None = None
    """The worker whose processing list holds the id (moves that end an attempt)."""
    due_ms: int | None = None
    """When a scheduled or retrying job is due, in ms since the epoch."""
    left: Status | None = None
    """The state the job left, where its Redis step depends on it (a deleted job's DLQ entry)."""

    @classmethod
    def of(cls, fields: Mapping[str, Any]) -> Committed:
        """A change from its fields' values (a field not named keeps its default), built as
        taskline.jobs.Job.of builds a job: one dict update instead of the frozen __init__'s
        object.__setattr__ per field, once per job of every enqueued batch."""
        change = object.__new__(cls)
        change.__dict__.update(fields)
        return change
