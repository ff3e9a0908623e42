"""Enqueue from the application, inside its own transaction: `taskline.enqueue(conn, ...)`.

    with engine.begin() as conn:                        # the application's transaction
        conn.execute(orders.insert().values(id=order_id, ...))
        job_id = taskline.enqueue(conn, "send_receipt", {"order": order_id}, priority="high")

    async with async_session.begin():                   # asyncio: the same, awaited
        job_id = await taskline.aenqueue(async_session, "send_receipt", {"order": order_id})

The sync and async calls share everything but the execution: validation and the statements
are prepared once, as a plan (taskline.store.caller), which `drive` runs on a sync connection
and `adrive` on an async one. A single plain job on a sync connection, the common call, runs
its insert straight and drives the plan's later steps only when that insert wrote nothing.

Invariant: the job exists exactly when the caller's transaction commits. The job, its first
event and its outbox row are written by one statement on the caller's connection, which also
signals `NOTIFY taskline_enqueued, '<queue>'` (and announces each job on
`taskline_enqueued_jobs`); PostgreSQL delivers the signals only at the commit, and a
rolled-back job leaves nothing behind, not even an id in Redis. After the commit the active
maintenance instance hears the signal and pushes the id to Redis
(taskline_maintenance.outbox), so an idle worker starts the job within milliseconds with
nothing more done by the caller; the outbox row keeps the job owed to Redis until then,
whatever was listening at the commit.

Validation is the API's own (taskline.jobspec): `fields` are those of POST /api/v1/jobs, and
what the API answers 422 raises InvalidJob here, with the same field errors. An idempotency
key names one request per queue as in the API: the same request again returns the first job's
id, another request with the key raises IdempotencyConflict. A job for one queue more than
`settings.max_queues` (TASKLINE_MAX_QUEUES) hold unfinished jobs raises QueueLimitReached (an
InvalidJob), the API's 422 `queue_limit`, and nothing is written. The queues are counted only
for a write to a queue holding no queued or running job (the insert tests that, writes nothing
and the count runs as a second statement, then the insert again): a write to a queue with work
pays for the test alone.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from functools import partial
from itertools import compress
from operator import is_not
from typing import Any, Literal, Required, TypedDict

from taskline import transitions, uniqueness
from taskline.errors import IdempotencyConflict, InvalidJob, QueueLimitReached
from taskline.jobs import Status, new_job_id
from taskline.jobspec import FieldError, JobSpec, parse_batch, parse_job
from taskline.settings import Settings
from taskline.store import caller
from taskline.store.caller import AppConnection, AsyncAppConnection
from taskline.store.params import rows_json

CHANNEL = "taskline_enqueued"
"""The channel the insert signals after commit, once per queue; its payload is the queue."""
JOBS_CHANNEL = "taskline_enqueued_jobs"
"""The channel the insert signals after commit, once per job; its payload names the job
(taskline.store.rows.Owed.from_announcement)."""
MAX_DEPTH = 64
"""Deepest nesting of a payload, as the API accepts in a request body."""

_DEFAULTS = Settings()
_STATEMENT_PARAMS = {"first_events": json.dumps(dict(transitions.FIRST_EVENTS)),
                     "queued": Status.QUEUED.value, "scheduled": Status.SCHEDULED.value}


Payload = Mapping[str, object] | Sequence[object] | str | int | float | None
"""A job's payload: a JSON value (objects with string keys)."""
Priority = int | Literal["low", "normal", "high", "critical"]
"""0..9 (9 runs first) or a name: low 2, normal 5, high 7, critical 9."""


class UniqueOptions(TypedDict, total=False):
    """`unique=`: at most one job of the queue holds `key` in `states` created within
    `period_s` (docs/unique.md); every field is optional."""

    key: str
    period_s: float | None
    states: list[str]
    on_conflict: Literal["return", "replace"]


class DebounceOptions(TypedDict):
    """`debounce=`: arrivals with one `key` while its job waits out `delay_s` join it."""

    key: str
    delay_s: float


class JobRequest(TypedDict, total=False):
    """One job of `enqueue_many`: `type` and the fields `enqueue` takes, so a type checker
    catches a misspelt key."""

    type: Required[str]
    payload: Payload
    queue: str
    priority: Priority
    max_retries: int
    timeout_s: float
    delay_s: float
    run_at: datetime | str
    idempotency_key: str
    limit_key: str
    unique: UniqueOptions
    debounce: DebounceOptions
    ordering_key: str
    tags: Sequence[str]
    expires_at: datetime | str
    start_within_s: float


def enqueue(conn: AppConnection, type: str, payload: Payload = None, *,
            queue: str | None = None, priority: Priority | None = None,
            max_retries: int | None = None, timeout_s: float | None = None,
            delay_s: float | None = None, run_at: datetime | str | None = None,
            idempotency_key: str | None = None, limit_key: str | None = None,
            unique: UniqueOptions | None = None, debounce: DebounceOptions | None = None,
            ordering_key: str | None = None, tags: Sequence[str] | None = None,
            expires_at: datetime | str | None = None, start_within_s: float | None = None,
            settings: Settings | None = None) -> uuid.UUID:
    """Enqueue one job inside `conn`'s transaction; its id. The fields are those of POST
    /api/v1/jobs (None: not given, the default applies); give `delay_s` or `run_at`, not
    both. Defaults for max_retries and timeout_s come from `settings` (the documented ones
    if None)."""
    fields = given(queue=queue, priority=priority, max_retries=max_retries,
                   timeout_s=timeout_s, delay_s=delay_s, run_at=run_at,
                   idempotency_key=idempotency_key, limit_key=limit_key, unique=unique,
                   debounce=debounce, ordering_key=ordering_key, tags=tags,
                   expires_at=expires_at, start_within_s=start_within_s)
    spec, schema = _one(type, payload, fields, settings)
    if spec.unique is None and spec.debounce is None:
        # A plain job: its insert is run straight, not driven through the plan's generator.
        return _write_now(conn, spec, _limit(settings), schema)
    return caller.drive(conn, _plan([spec], settings), schema)[0]


async def aenqueue(conn: AsyncAppConnection, type: str, payload: Payload = None, *,
                   queue: str | None = None, priority: Priority | None = None,
                   max_retries: int | None = None, timeout_s: float | None = None,
                   delay_s: float | None = None, run_at: datetime | str | None = None,
                   idempotency_key: str | None = None, limit_key: str | None = None,
                   unique: UniqueOptions | None = None,
                   debounce: DebounceOptions | None = None,
                   ordering_key: str | None = None, tags: Sequence[str] | None = None,
                   expires_at: datetime | str | None = None,
                   start_within_s: float | None = None,
                   settings: Settings | None = None) -> uuid.UUID:
    """`enqueue` on an async connection (psycopg AsyncConnection, SQLAlchemy AsyncConnection,
    AsyncSession or async_scoped_session), inside its transaction."""
    fields = given(queue=queue, priority=priority, max_retries=max_retries,
                   timeout_s=timeout_s, delay_s=delay_s, run_at=run_at,
                   idempotency_key=idempotency_key, limit_key=limit_key, unique=unique,
                   debounce=debounce, ordering_key=ordering_key, tags=tags,
                   expires_at=expires_at, start_within_s=start_within_s)
    spec, schema = _one(type, payload, fields, settings)
    return (await caller.adrive(conn, _plan([spec], settings), schema))[0]


def given(**fields: Any) -> dict[str, Any]:
    """The keyword arguments a caller gave (None: not given)."""
    # Filtered in C (compress over an `is not None` map): a comprehension ran about 90 Python
    # bytecode instructions for the 14 fields of every enqueue, most of them not given.
    return dict(compress(fields.items(), map(_IS_GIVEN, fields.values())))


_IS_GIVEN = partial(is_not, None)


def enqueue_many(conn: AppConnection, jobs: Iterable[JobRequest | Mapping[str, Any]], *,
                 settings: Settings | None = None) -> list[uuid.UUID]:
    """Enqueue up to 1,000 jobs inside `conn`'s transaction, all or none; their ids in order.

    Each job is a mapping of `type`, `payload` and `enqueue`'s fields. A call that raises wrote
    none of its jobs (a savepoint undoes it), whatever else the caller's transaction holds.
    """
    specs, schema = _many(jobs, settings)
    if not specs:
        caller.sync_target(conn)  # a wrong object is refused even with nothing to write
        return []
    if not _needs_savepoint(specs):
        # One statement: atomic by itself.
        return caller.drive(conn, _plan(specs, settings), schema)
    with caller.savepoint(conn):
        return caller.drive(conn, _plan(specs, settings), schema)


async def aenqueue_many(conn: AsyncAppConnection,
                        jobs: Iterable[JobRequest | Mapping[str, Any]], *,
                        settings: Settings | None = None) -> list[uuid.UUID]:
    """`enqueue_many` on an async connection, with the same all-or-none savepoint."""
    specs, schema = _many(jobs, settings)
    if not specs:
        await caller.async_target(conn)
        return []
    if not _needs_savepoint(specs):
        return await caller.adrive(conn, _plan(specs, settings), schema)
    async with caller.asavepoint(conn):
        return await caller.adrive(conn, _plan(specs, settings), schema)


def _one(type: Any, payload: Any, fields: Mapping[str, Any],
         settings: Settings | None) -> tuple[JobSpec, str]:
    """One job validated as the API validates it, and the schema to write it in."""
    body = _body(type, payload, fields)
    spec = parse_job(body, settings or _DEFAULTS)
    if isinstance(spec, list):
        raise InvalidJob([e.to_dict() for e in spec])
    _check_payload(body, "payload")
    return spec, (settings or _DEFAULTS).schema


def _many(jobs: Iterable[JobRequest | Mapping[str, Any]],
          settings: Settings | None) -> tuple[list[JobSpec], str]:
    """A batch validated as POST /api/v1/jobs/batch validates it, and the schema."""
    bodies = [_body(job.get("type"), job.get("payload"),
                    {k: v for k, v in job.items() if k not in ("type", "payload")})
              for job in jobs]
    schema = (settings or _DEFAULTS).schema
    if not bodies:
        return [], schema
    specs = parse_batch({"jobs": bodies}, settings or _DEFAULTS)
    errors = [e for e in specs if isinstance(e, FieldError)]
    if errors:
        raise InvalidJob([e.to_dict() for e in errors])
    for index, body in enumerate(bodies):
        _check_payload(body, f"jobs[{index}].payload")
    return [s for s in specs if isinstance(s, JobSpec)], schema


def _needs_savepoint(specs: Sequence[JobSpec]) -> bool:
    """A batch is one statement, atomic by itself, unless a key's replay lookup follows it
    or its jobs with unique or debounce are written one by one (taskline.uniqueness)."""
    return len(specs) > 1 and (any(s.idempotency_key is not None for s in specs)
                               or uniqueness.keyed(specs))


def _plan(specs: Sequence[JobSpec], settings: Settings | None) -> caller.Plan[list[uuid.UUID]]:
    """The plain insert, or (any job with unique or debounce) the keyed plan; ids in order.
    A unique duplicate or a debounce arrival gets the id of the job it was folded into."""
    if not uniqueness.keyed(specs):
        if len(specs) == 1:  # aenqueue's plain job: the single enqueue's smaller statement
            return _write_one(specs[0], _limit(settings))
        return _write(specs, _limit(settings))
    return _ids(uniqueness.write(specs, uniqueness.Context(
        max_queues=_limit(settings), max_bytes=(settings or _DEFAULTS).max_payload_bytes,
        announce=True)))


def _ids(plan: caller.Plan[list[uniqueness.Written]]) -> caller.Plan[list[uuid.UUID]]:
    written = yield from plan
    return [w.job.id for w in written]


def _body(type: Any, payload: Any, fields: Mapping[str, Any]) -> dict[str, Any]:
    """The request as the API would read it from JSON (a datetime run_at as RFC 3339)."""
    body: dict[str, Any] = {"type": type, **fields}
    if payload is not None:
        body["payload"] = payload
    if "run_at" in fields or "expires_at" in fields:  # most jobs give neither
        for name in ("run_at", "expires_at"):
            instant = body.get(name)
            if isinstance(instant, datetime):
                # A naive datetime names no instant: left without an offset, parse_job refuses it.
                body[name] = instant.isoformat().replace("+00:00", "Z")
    return body


def _limit(settings: Settings | None) -> int:
    """TASKLINE_MAX_QUEUES of `settings` (the documented default if None)."""
    return (settings or _DEFAULTS).max_queues


def _write(specs: Sequence[JobSpec], max_queues: int) -> caller.Plan[list[uuid.UUID]]:
    """Insert `specs` in one statement, and what its answer asks for next (_written). Ids in the
    order of `specs`."""
    statement, order, rows = _insert(specs, max_queues)
    written = yield statement
    fresh = [r.fresh for r in written if r.fresh is not None]
    return (yield from _written(specs, order, rows, written, fresh, max_queues))


def _write_one(spec: JobSpec, max_queues: int) -> caller.Plan[list[uuid.UUID]]:
    """`_write` of one job: its insert (enqueue_one_in_transaction: the queue limit judged on
    its own row, an idle queue's count included), then, only when it wrote nothing, the later
    steps, its queue counted first: the limit refused it (the count names the queues), or the
    job is a key's replay."""
    rows = [_row(spec)]
    if (yield _one_statement(rows, max_queues)):
        return [rows[0]["id"]]
    return (yield from _written((spec,), [0], rows, [], [spec.queue], max_queues))


def _write_now(conn: AppConnection, spec: JobSpec, max_queues: int, schema: str) -> uuid.UUID:
    """`_write_one` on the sync connection `conn`, its insert run straight rather than driven
    through the plan's generator (about 100 bytecode instructions a call, docs/performance.md)."""
    target = caller.sync_target(conn)
    rows = [_row(spec)]
    if caller.execute(target, _one_statement(rows, max_queues), schema):
        return rows[0]["id"]  # type: ignore[no-any-return]
    return caller.drive(target, _written((spec,), [0], rows, [], [spec.queue], max_queues),
                        schema)[0]


def _one_statement(rows: list[dict[str, Any]], max_queues: int) -> caller.Statement:
    return caller.Statement("enqueue_one_in_transaction", {"jobs": rows_json(rows),
                                                           **_STATEMENT_PARAMS,
                                                           "max_queues": max_queues})


def _insert(specs: Sequence[JobSpec],
            max_queues: int) -> tuple[caller.Statement, list[int], list[dict[str, Any]]]:
    """The statement inserting `specs`, the order it writes them in (indexes into `specs`) and
    their rows in that order.

    Keys are locked in one global order (queue, key), so two callers sharing keys in opposite
    orders wait for each other instead of deadlocking.
    """
    order = sorted(range(len(specs)), key=lambda i: (specs[i].idempotency_key is not None,
                                                     specs[i].queue,
                                                     specs[i].idempotency_key or ""))
    rows = [_row(specs[i]) for i in order]
    return _insert_rows(rows, max_queues, limit_checked=False), order, rows


def _insert_rows(rows: list[dict[str, Any]], max_queues: int, *,
                 limit_checked: bool) -> caller.Statement:
    return caller.Statement("enqueue_in_transaction", {"jobs": rows_json(rows),
                                                       **_STATEMENT_PARAMS,
                                                       "max_queues": max_queues,
                                                       "limit_checked": limit_checked})


def _written(specs: Sequence[JobSpec], order: list[int], rows: list[dict[str, Any]],
             written: list, fresh: list[str], max_queues: int) -> caller.Plan[list[uuid.UUID]]:
    """What an insert's answer `written` still asks for; the ids in the order of `specs`.

    With `fresh` queues (holding no queued or running job, which the insert's own verdict
    refused) the insert wrote nothing: they are counted against `max_queues` (QueueLimitReached,
    nothing written, when one too many; the count names the refused queues) and, admitted after
    all, the insert runs again, counted. A job the insert skipped holds a key some job already
    had: its id is a replay's (_replay_id).
    """
    if fresh:
        refused = yield caller.Statement("queue_limit_refused", {"queues": sorted(fresh),
                                                                 "max_queues": max_queues})
        if refused:
            raise QueueLimitReached(list(refused[0].refused), max_queues)
        written = yield _insert_rows(rows, max_queues, limit_checked=True)
    inserted = {r.id for r in written}
    ids: dict[int, uuid.UUID] = {}
    for index, row in zip(order, rows, strict=True):
        if row["id"] in inserted:
            ids[index] = row["id"]
        else:
            spec = specs[index]
            ids[index] = _replay_id(spec, (yield _replay_lookup(spec)))
    return [ids[i] for i in range(len(specs))]


_OPTIONAL = ("run_at", "idempotency_key", "request_hash", "limit_key", "ordering_key", "tags",
             "expires_at", "start_within_s")
"""The insert row's fields most jobs leave unset: written only when set, as the statement's
json_to_recordset reads an absent field as NULL. A plain job's row is then half the JSON
PostgreSQL parses (docs/performance.md, change 115)."""


def _row(spec: JobSpec) -> dict[str, Any]:
    row = {"id": new_job_id(), "type": spec.type, "queue": spec.queue, "payload": spec.payload,
           "priority": spec.priority, "max_retries": spec.max_retries,
           "timeout_s": spec.timeout_s, "delay_s": spec.delay_s}
    for name in _OPTIONAL:
        value = getattr(spec, name)
        if value is not None:
            row[name] = value
    return row


def _replay_lookup(spec: JobSpec) -> caller.Statement:
    """The statement finding the job that holds the spec's idempotency key in its queue."""
    return caller.Statement("get_job_by_key", {"queue": spec.queue,
                                               "idempotency_key": spec.idempotency_key or ""})


def _replay_id(spec: JobSpec, found: list) -> uuid.UUID:
    """The job a key names in its queue (`found`, _replay_lookup's rows): the same request gets
    its id, another one fails."""
    key = spec.idempotency_key or ""
    if not found:
        # ON CONFLICT waited for the other writer's commit, so its row is visible here.
        raise RuntimeError(f"idempotency key {key!r} conflicted but no job holds it")
    if found[0].request_hash != spec.request_hash:
        raise IdempotencyConflict(
            f"idempotency key {key!r} was used for job {found[0].id} with a different body")
    return found[0].id  # type: ignore[no-any-return]


def _check_payload(body: Mapping[str, Any], field: str) -> None:
    """A payload must be what a JSON body can carry and jsonb can store; InvalidJob if not."""
    if "payload" in body:
        problem = payload_problem(body["payload"])
        if problem is not None:
            raise InvalidJob([{"field": field, "message": problem}])


def payload_problem(value: Any) -> str | None:
    """Why `value` cannot be a job's payload (None when it can): JSON types only (str keys),
    finite numbers, no NUL or lone surrogate in any string, nested at most MAX_DEPTH levels.
    Iterative, so a deep value cannot exhaust the stack."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list | tuple):
            problem = _container_problem(item, depth)
            if problem is not None:
                return problem
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
        else:
            problem = _scalar_problem(item)
            if problem is not None:
                return problem
    return None


def _container_problem(item: dict | list | tuple, depth: int) -> str | None:
    if depth > MAX_DEPTH:
        return f"must be nested at most {MAX_DEPTH} levels deep"
    if isinstance(item, dict):
        if not all(isinstance(k, str) for k in item):
            return "object keys must be strings"
        if any(_bad_text(k) for k in item):
            return _BAD_TEXT
    return None


def _scalar_problem(item: Any) -> str | None:
    if isinstance(item, str):
        return _BAD_TEXT if _bad_text(item) else None
    if isinstance(item, float):
        return None if math.isfinite(item) else "must hold finite numbers only (no NaN or Infinity)"
    if item is None or isinstance(item, bool | int):
        return None
    return f"must be JSON (a {type(item).__name__} is not)"


_BAD_TEXT = "must not hold a NUL character or a lone surrogate"


def _bad_text(text: str) -> bool:
    if "\x00" in text:
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
