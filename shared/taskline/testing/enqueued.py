"""`enqueued` and `assert_enqueued`: the jobs a test wrote, read back through its connection.

A job counts when it is visible to `conn` (committed, or written in its open transaction) and
its id was made since the test began: ids are UUIDv7s, made on the enqueuing host, so the test's
clock, not PostgreSQL's, draws the line. The pytest plugin records when each test begins; without
it (or with `since=`), the caller says from when.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from taskline.jobs import parse_priority, visible_key
from taskline.store import caller
from taskline.store.queries import DEFAULT_SCHEMA

MATCHED = ("payload", "queue", "priority", "run_at", "idempotency_key")
RUN_AT_TOLERANCE_S = 1.0
"""How far apart a job's run time and the expected one may be: a delay becomes a time in
PostgreSQL's clock, a moment after the test computed its expectation."""


def enqueued(conn: Any, type: str | None = None, *, since: float | datetime | None = None,
             schema: str = DEFAULT_SCHEMA, **match: Any) -> list[dict[str, Any]]:
    """The jobs of `type` (any type if None) visible to `conn` and made since the test began
    (or `since`: a datetime or a Unix time), oldest first, that match every field of `match`:
    `payload` (a mapping matches a job whose payload holds its keys with equal values; else
    equality), `queue`, `priority` (0..9 or a name), `run_at` (a datetime, within a second) and
    `idempotency_key`. Each job is a dict: id, type, queue, payload, priority, status, run_at,
    idempotency_key, created_at."""
    unknown = sorted(set(match) - set(MATCHED))
    if unknown:
        raise TypeError(f"enqueued() cannot match on {', '.join(unknown)}; "
                        f"it matches {', '.join(MATCHED)}")
    rows = caller.run(conn, "testing_enqueued", {"floor": str(_floor(since)), "type": type},
                      schema)
    jobs = [_job(r) for r in rows]
    return [job for job in jobs if _matches(job, match)]


def assert_enqueued(conn: Any, type: str, *, since: float | datetime | None = None,
                    schema: str = DEFAULT_SCHEMA, **match: Any) -> dict[str, Any]:
    """The one job `enqueued` finds; AssertionError listing what was enqueued instead when it
    finds none, or listing the matches when it finds several."""
    found = enqueued(conn, type, since=since, schema=schema, **match)
    if len(found) == 1:
        return found[0]
    if found:
        raise AssertionError(f"{len(found)} jobs of type {type!r} match {match}:\n"
                             + _listing(found))
    others = enqueued(conn, since=since, schema=schema)
    wanted = f"a job of type {type!r}" + (f" matching {match}" if match else "")
    if not others:
        raise AssertionError(f"expected {wanted}; no job was enqueued")
    raise AssertionError(f"expected {wanted}; enqueued instead:\n" + _listing(others))


def started_at() -> float | None:
    """When the running test began (Unix time), as the pytest plugin recorded it."""
    plugin = sys.modules.get("taskline_pytest")
    return None if plugin is None else plugin.test_began


def _floor(since: float | datetime | None) -> uuid.UUID:
    """The smallest UUIDv7 made at or after `since` (default: the test's start, else 0)."""
    if since is None:
        since = started_at() or 0.0
    seconds = since.timestamp() if isinstance(since, datetime) else float(since)
    millis = max(int(seconds * 1000), 0)
    return uuid.UUID(int=(millis << 80) | (0x7 << 76))


def _job(row: Any) -> dict[str, Any]:
    return {"id": str(row.id), "type": row.type, "queue": row.queue, "payload": row.payload,
            "priority": row.priority, "status": row.status, "run_at": row.next_run_at,
            "idempotency_key": visible_key(row.idempotency_key),
            "created_at": row.created_at}


def _matches(job: dict[str, Any], match: Mapping[str, Any]) -> bool:
    for name, want in match.items():
        have = job[name]
        if name == "payload":
            ok = _payload_matches(have, want)
        elif name == "priority":
            ok = have == parse_priority(want)
        elif name == "run_at":
            ok = have is not None and abs((have - want).total_seconds()) <= RUN_AT_TOLERANCE_S
        else:
            ok = have == want
        if not ok:
            return False
    return True


def _payload_matches(have: Any, want: Any) -> bool:
    if isinstance(want, Mapping):
        return isinstance(have, Mapping) and all(
            key in have and have[key] == value for key, value in want.items())
    return bool(have == want)


def _listing(jobs: list[dict[str, Any]]) -> str:
    return "\n".join(f"  {j['type']} queue={j['queue']} priority={j['priority']} "
                     f"payload={j['payload']!r} status={j['status']}" for j in jobs)

