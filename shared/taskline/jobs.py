"""The job model: states, attempt outcomes, history events, priorities, ids and the backoff
curve. Pure: no Redis and no SQL.

Invariant: these are plain values; every decision about a job's next state is made from them
in taskline.transitions (the lifecycle's one table), so the policy is unit-tested without I/O
and the store only executes what was decided.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import operator
import random
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Any

from uuid_utils.compat import uuid7


class Status(enum.StrEnum):
    """Job states; taskline.transitions holds every move between them (docs/states.md)."""

    SCHEDULED = "scheduled"
    QUEUED = "queued"
    RUNNING = "running"
    RETRYING = "retrying"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"
    WAITING = "waiting"  # a workflow step whose parents have not all succeeded yet

    @property
    def terminal(self) -> bool:
        return self in TERMINAL

    @property
    def pending(self) -> bool:
        return self in PENDING


class RedisHome(enum.StrEnum):
    """Where Redis holds the id of a job in a state (taskline.dispatch.keys names the keys)."""

    READY = "ready"  # a ready list of its priority (a worker's processing list once fetched)
    PROCESSING = "processing"  # the processing list of the worker holding its lease
    DELAYED = "delayed"  # its queue's retry or scheduled set, scored by its due time
    DLQ = "dlq"  # its queue's dead-letter list
    NONE = "none"  # nowhere: finished, or waiting in PostgreSQL only


REDIS_HOME: Mapping[Status, RedisHome] = MappingProxyType({
    Status.SCHEDULED: RedisHome.DELAYED,
    Status.QUEUED: RedisHome.READY,
    Status.RUNNING: RedisHome.PROCESSING,
    Status.RETRYING: RedisHome.DELAYED,
    Status.SUCCEEDED: RedisHome.NONE,
    Status.DEAD: RedisHome.DLQ,
    Status.CANCELLED: RedisHome.NONE,
    # A waiting step is in no Redis structure until its release (taskline.transitions.UNBLOCK).
    Status.WAITING: RedisHome.NONE,
})
"""The one map from state to Redis home: taskline.mirror follows it, the reconciler's verdicts
and the pending-state SQL (taskline.store.schema.PENDING_SQL) are derived from it."""

TERMINAL = frozenset({Status.SUCCEEDED, Status.DEAD, Status.CANCELLED})
DELAYED = frozenset(s for s, home in REDIS_HOME.items() if home is RedisHome.DELAYED)
"""The states waiting for a due time in a Redis set (retrying, scheduled)."""
PENDING = frozenset(s for s, home in REDIS_HOME.items()
                    if home in (RedisHome.READY, RedisHome.DELAYED))
"""The states whose ids Redis holds until a worker takes them (queued, scheduled, retrying)."""
CANCELLABLE = PENDING | {Status.RUNNING, Status.WAITING}

MIN_PRIORITY = 0
MAX_PRIORITY = 9
PRIORITY_NAMES = {"low": 2, "normal": 5, "high": 7, "critical": 9}
DEFAULT_PRIORITY = PRIORITY_NAMES["normal"]


class Outcome(enum.StrEnum):
    """How one attempt (one job_leases row) ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    LOST = "lost"  # lease expired; recovered by the reaper
    RELEASED = "released"  # handed back at shutdown, attempt not counted
    SNOOZED = "snoozed"  # the handler raised Snooze: back to scheduled, attempt not counted


class Event(enum.StrEnum):
    """Entries of the append-only job_events history."""

    ENQUEUED = "enqueued"
    SCHEDULED = "scheduled"
    PROMOTED = "promoted"
    CLAIMED = "claimed"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    RETRY_SCHEDULED = "retry_scheduled"
    DEAD_LETTERED = "dead_lettered"
    CANCEL_REQUESTED = "cancel_requested"
    CANCELLED = "cancelled"
    RECOVERED = "recovered"
    RELEASED = "released"
    REQUEUED = "requeued"
    RESTORED = "restored"
    WAITING = "waiting"  # created as a workflow step that waits for its parents
    UNBLOCKED = "unblocked"  # its last parent succeeded: queued in that same transaction
    JOINED = "joined"  # a debounced arrival joined this waiting job (taskline.uniqueness)
    REPLACED = "replaced"  # a unique enqueue with on_conflict "replace" rewrote it
    PROGRESS = "progress"  # its running handler reported progress (detail.progress); no move
    LAPSED = "lapsed"  # not started by its expires_at: cancelled by maintenance
    SNOOZED = "snoozed"  # its handler raised Snooze: scheduled again, the attempt not counted
    EXPIRED = "expired"  # deleted by retention: names the move; no row records it (the
    # history goes with the job)
    PURGED = "purged"  # deleted from the DLQ by an operator: no row records it either


def parse_priority(value: object) -> int:
    """0..9 or a name (low, normal, high, critical); ValueError otherwise. Booleans are rejected."""
    if isinstance(value, str) and value.lower() in PRIORITY_NAMES:
        return PRIORITY_NAMES[value.lower()]
    if isinstance(value, int) and not isinstance(value, bool) and (
            MIN_PRIORITY <= value <= MAX_PRIORITY):
        return value
    raise ValueError("priority must be an integer 0..9 or one of low, normal, high, critical")


KEY_SCOPE_END = "\x1f"
"""Ends the principal's part of a stored idempotency key: a key itself is visible ASCII
(taskline.jobspec), so it never holds this character and a scoped key reads back unambiguously."""


def scoped_key(key: str | None, scope: str | None) -> str | None:
    """The idempotency key as stored for the principal whose keys are `scope` (None: the one
    scope the library and a deployment without authentication share, stored as given).

    Scoping in the stored value keeps the unique index on (queue, key) as the one arbiter of
    concurrent duplicates, with no column or index to migrate: another principal's same key
    is simply another key."""
    if key is None or scope is None:
        return key
    return f"{scope}{KEY_SCOPE_END}{key}"


def visible_key(stored: str | None) -> str | None:
    """The key a client sent, from its stored (possibly scoped) form."""
    return None if stored is None else stored.rpartition(KEY_SCOPE_END)[2]


def new_job_id() -> uuid.UUID:
    """A fresh job id: a UUIDv7 (RFC 9562), whose leading 48 bits are the Unix time in ms.

    Ids made later sort later, so every index keyed by job id (the primary key, the pending-id
    index, the events' and leases' job_id indexes) grows at its right edge instead of at a
    random leaf: an insert dirties the few pages already cached and written to the WAL since the
    last checkpoint, so PostgreSQL spends less CPU per job than with random (v4) ids
    (docs/performance.md). The id reveals when the job was made, to the ms,
    which `created_at` shows anyway. Python 3.14 has uuid.uuid7; until then uuid-utils makes it.
    """
    return uuid7()


def parse_job_id(value: str) -> uuid.UUID | None:
    """The UUID in `value`, or None when it is not one (the API answers 404 before any SQL)."""
    try:
        return uuid.UUID(value)
    except (ValueError, AttributeError, TypeError):
        return None


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with full jitter on the upper half: base * factor^(n-1), capped."""

    base_s: float = 10.0
    factor: float = 4.0
    max_s: float = 3600.0

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Delay before the retry that follows failed attempt number `attempt` (1-based).

        The jitter keeps at least half of the nominal delay, so the schedule stays recognisable
        (10 s, 40 s, 160 s ...) while a burst of failures spreads instead of retrying in lockstep.
        """
        exponent = max(attempt - 1, 0)
        try:
            nominal = min(self.base_s * self.factor**exponent, self.max_s)
        except OverflowError:
            nominal = self.max_s
        r = (rng or random).random()
        return nominal / 2 + r * nominal / 2


@dataclass(frozen=True)
class Job:
    """A row of `jobs`, as the store returns it."""

    id: uuid.UUID
    type: str
    queue: str
    payload: Any
    priority: int
    status: Status
    attempts: int
    max_retries: int
    timeout_s: float
    next_run_at: datetime | None
    idempotency_key: str | None
    last_error: str | None
    result: Any
    created_at: datetime
    updated_at: datetime
    cancel_requested: bool = False
    trace_context: str | None = None
    workflow_id: uuid.UUID | None = None
    """The workflow this job is a step of (taskline.workflows); None for a plain job."""
    step: str | None = None
    """The step's id within its workflow."""
    run_when: str | None = None
    """A step's condition (`any_failed`, `always`); None waits for every parent's success."""
    limit_key: str | None = None
    """The budget this job draws from under a `per_key` flow limit."""
    ordering_key: str | None = None
    """Jobs of the queue with this key start one at a time, in enqueue order."""
    snoozes: int = 0
    """How many times its handler snoozed it (TASKLINE_MAX_SNOOZES bounds them)."""
    tags: tuple[str, ...] | None = None
    """Up to 20 labels, what `GET /api/v1/jobs?tag=` filters by."""
    progress: Any = None
    """The last progress its handler reported (`ctx.progress`): 0..1 or a JSON object."""
    expires_at: datetime | None = None
    """Not started by then, it is never leased and maintenance cancels it (event `lapsed`)."""
    schedule: str | None = None
    """The schedule whose slot enqueued the job (None for a job enqueued otherwise)."""
    scheduled_for: datetime | None = None
    """That slot's instant."""
    unique_key: str | None = None
    """A unique job's key as stored (scoped like an idempotency key; taskline.uniqueness)."""
    debounce_key: str | None = None
    """A debounced job's key."""
    coalesced: list[Any] | None = None
    """A debounced job's payloads, in arrival order, its first included (`ctx.coalesced`)."""

    @classmethod
    def of(cls, fields: Mapping[str, Any]) -> Job:
        """A job from its fields' values, each of its field's type (nothing is converted); a
        field not named keeps its default.

        Skips the frozen dataclass __init__, which sets each of the 31 fields through
        object.__setattr__: about 4 us a job, more than the rest of a batch enqueue's Python
        work for it, where one dict update is 0.3 us (docs/performance.md). Unnamed fields read
        their defaults from the class, as dataclasses store them there."""
        job = object.__new__(cls)
        job.__dict__.update(fields)
        return job

    @classmethod
    def from_row(cls, row: Any) -> Job:
        """A job from a `jobs` row: a SQLAlchemy Row or a named tuple read straight off psycopg.

        Both are tuples with `_fields`: the columns that are Job fields are picked by position
        (where, once per column list, _columns found them), so a row of any query holding the
        required columns builds a job with no lookup by name, and columns it lacks keep their
        defaults."""
        names, pick = _columns(row._fields)
        fields = dict(zip(names, pick(row), strict=True))
        fields["status"] = Status(fields["status"])
        fields["timeout_s"] = float(fields["timeout_s"])
        if fields.get("tags") is not None:
            fields["tags"] = tuple(fields["tags"])
        if "snoozes" in fields and fields["snoozes"] is None:
            del fields["snoozes"]
        return cls.of(fields)

    def to_dict(self) -> dict[str, Any]:
        # Once per job of every answer (a batch's 1,000): the fields a plain job leaves None
        # are tested here rather than passed to a function that returns None.
        key, tags, expires = self.idempotency_key, self.tags, self.expires_at
        out = {
            "id": str(self.id), "type": self.type, "queue": self.queue, "payload": self.payload,
            "priority": self.priority, "status": self.status.value, "attempts": self.attempts,
            "max_retries": self.max_retries, "timeout_s": self.timeout_s,
            "next_run_at": _iso(self.next_run_at),
            "idempotency_key": None if key is None else visible_key(key),
            "last_error": self.last_error, "result": self.result,
            "cancel_requested": self.cancel_requested, "limit_key": self.limit_key,
            "ordering_key": self.ordering_key, "tags": list(tags) if tags else [],
            "progress": self.progress, "expires_at": None if expires is None else _iso(expires),
            "created_at": _iso(self.created_at), "updated_at": _iso(self.updated_at),
        }
        # The optional parts only when set: a plain job builds no dict for them.
        if self.workflow_id is not None:
            out["workflow_id"] = str(self.workflow_id)
            out["step"] = self.step
            out["when"] = self.run_when or "all_succeeded"
        out["schedule"] = self.schedule
        out["scheduled_for"] = None if self.scheduled_for is None else _iso(self.scheduled_for)
        if self.unique_key is not None:
            out["unique_key"] = visible_key(self.unique_key)
        if self.debounce_key is not None:
            out["debounce"] = {"key": visible_key(self.debounce_key),
                               "joined": len(self.coalesced or ())}
        return out


_FIELDS = frozenset(Job.__dataclass_fields__)
_REQUIRED = frozenset(name for name, f in Job.__dataclass_fields__.items()
                      if f.default is dataclasses.MISSING)


@functools.lru_cache(maxsize=256)
def _columns(names: tuple[str, ...]) -> tuple[tuple[str, ...], Callable[[Any], tuple[Any, ...]]]:
    """The Job fields among a row's columns and what picks their values from the row."""
    missing = _REQUIRED.difference(names)
    if missing:
        raise ValueError(f"a jobs row needs the columns {sorted(missing)}")
    keep = [i for i, name in enumerate(names) if name in _FIELDS]
    # More than one index always (the required columns), so itemgetter returns a tuple.
    return tuple(names[i] for i in keep), operator.itemgetter(*keep)


def _iso(value: datetime | None) -> str | None:
    # A batch's jobs share their timestamps (one statement's now()), so the text is cached;
    # instant, zone and fold together fix it (equal datetimes may differ in zone or fold).
    return None if value is None else _isoformat(value, value.tzinfo, value.fold)


@functools.lru_cache(maxsize=256)
def _isoformat(value: datetime, _tz: Any, _fold: int) -> str:
    return value.isoformat()
