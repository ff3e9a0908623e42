"""Writing a large batch of new jobs by COPY: the rows insert_jobs_with_events would write.

A batch whose jobs hold no idempotency key can skip nothing, so it needs neither ON CONFLICT
nor the JSON recordset the one-statement insert parses: two binary COPYs (jobs, then their first
events) in one transaction write the same rows with less PostgreSQL CPU per job, and
PostgreSQL consumes the stream while Python still writes it. The extra round trips (the
transaction's start and end, its clock, each COPY's start and end) make it slower for small
batches, hence COPY_MIN_JOBS (docs/performance.md).

Invariant: every row and value equals what the statement writes; created_at and updated_at
are the transaction's now(), and a job's next_run_at is its run_at or now() plus its delay, by
PostgreSQL's clock read in the same transaction. The queue limit (TASKLINE_MAX_QUEUES) is
checked in that transaction before anything is written, as the statement checks it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

import orjson
import psycopg
from psycopg.types.json import set_json_dumps

from taskline import transitions
from taskline.store.queries import DEFAULT_SCHEMA, in_schema

# Below this many jobs the one-statement insert takes less time.
COPY_MIN_JOBS = 100

_JOB_COLUMNS = ("id", "type", "queue", "payload", "priority", "status", "max_retries",
                "timeout_s", "next_run_at", "request_hash", "trace_context", "created_at",
                "updated_at", "limit_key", "ordering_key", "tags", "expires_at")
_JOB_TYPES = ("uuid", "text", "text", "jsonb", "int2", "text", "int4", "float8", "timestamptz",
              "text", "text", "timestamptz", "timestamptz", "text", "text", "text[]",
              "timestamptz")
_COPY_JOBS = f"COPY taskline.jobs ({', '.join(_JOB_COLUMNS)}) FROM STDIN (FORMAT BINARY)"
# A batch using none of the last three columns (ordering key, tags, expiry) leaves them to
# their NULL default: less for Python to write and PostgreSQL to parse per job.
_PLAIN = _JOB_COLUMNS.index("limit_key") + 1
_COPY_PLAIN_JOBS = (f"COPY taskline.jobs ({', '.join(_JOB_COLUMNS[:_PLAIN])}) "
                    "FROM STDIN (FORMAT BINARY)")
_COPY_EVENTS = "COPY taskline.job_events (job_id, attempt, event, actor) FROM STDIN (FORMAT BINARY)"
_EVENT_TYPES = ("uuid", "int4", "text", "text")


class Inserted(NamedTuple):
    """What insert_jobs_with_events returns of each job it wrote."""

    id: uuid.UUID
    payload: Any
    next_run_at: datetime
    created_at: datetime
    updated_at: datetime


def copyable(jobs: Sequence[dict[str, Any]]) -> bool:
    """Whether COPY may write `jobs`: enough of them, and none that a key could make skip (an
    idempotency key; a unique or debounce key never reaches here: taskline.uniqueness)."""
    return len(jobs) >= COPY_MIN_JOBS and all(
        j["idempotency_key"] is None and j.get("unique_key") is None
        and j.get("debounce_key") is None for j in jobs)


def copy_jobs_with_events(driver: psycopg.Connection, jobs: Sequence[dict[str, Any]],
                          schema: str = DEFAULT_SCHEMA,
                          gate: Callable[[psycopg.Cursor, set[str]], None] | None = None
                          ) -> list[Inserted]:
    """Write `jobs` (insert_job's fields each, no idempotency key) and each one's first event in
    one transaction on `driver`, a connection outside any transaction; committed on return.
    `gate(cursor, queues)` runs first in that transaction and may raise to write nothing."""
    with driver.transaction(), driver.cursor() as cursor:
        if gate is not None:
            gate(cursor, {job["queue"] for job in jobs})
        set_json_dumps(_dumps, cursor)
        now = cursor.execute("SELECT now()").fetchone()[0]
        inserted = [_inserted(job, now) for job in jobs]
        plain = not any(_extended(job) for job in jobs)
        with cursor.copy(in_schema(_COPY_PLAIN_JOBS if plain else _COPY_JOBS, schema)) as copy:
            copy.set_types(_JOB_TYPES[:_PLAIN] if plain else _JOB_TYPES)
            for job, row in zip(jobs, inserted, strict=True):
                values = (row.id, job["type"], job["queue"], row.payload, job["priority"],
                          job["status"], job["max_retries"], job["timeout_s"], row.next_run_at,
                          job["request_hash"], job["trace_context"], now, now,
                          job.get("limit_key"))
                copy.write_row(values if plain else (
                    *values, job.get("ordering_key"), _tags(job.get("tags")),
                    _expires_at(job, now)))
        with cursor.copy(in_schema(_COPY_EVENTS, schema)) as copy:
            copy.set_types(_EVENT_TYPES)
            for job, row in zip(jobs, inserted, strict=True):
                copy.write_row((row.id, 0, _first_event(job["status"]), job.get("actor")))
    return inserted


def _extended(job: dict[str, Any]) -> bool:
    """Whether `job` sets a column past limit_key (_COPY_PLAIN_JOBS leaves those NULL)."""
    return (job.get("ordering_key") is not None or job.get("tags") is not None
            or job.get("expires_at") is not None or job.get("start_within_s") is not None)


def _expires_at(job: dict[str, Any], now: datetime) -> datetime | None:
    """As the insert statements compute it: the given instant, or now + start_within_s."""
    within = job.get("start_within_s")
    return job.get("expires_at") or (None if within is None else now + timedelta(seconds=within))


def _tags(tags: Any) -> list[str] | None:
    return None if tags is None else list(tags)


def _inserted(job: dict[str, Any], now: datetime) -> Inserted:
    """The returned fields of `job`, its id as a UUID (the statement takes its text too)."""
    job_id, run_at = job["id"], job["run_at"]
    due = run_at if run_at is not None else now + timedelta(seconds=job["delay_s"])
    return Inserted(job_id if isinstance(job_id, uuid.UUID) else uuid.UUID(job_id),
                    job["payload"], due, now, now)


def _first_event(status: str) -> str:
    return transitions.FIRST_EVENTS[status]


def _dumps(value: Any) -> bytes | str:
    """A payload as JSON text for its jsonb column, as the statement's JSON array holds it:
    orjson, or the standard library for what orjson refuses (an integer past 64 bits)."""
    try:
        return orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
