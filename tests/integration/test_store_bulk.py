"""Large batches without idempotency keys are written by COPY (taskline.store.bulk) against real
PostgreSQL: the same rows, events and returned fields as the one-statement insert, all or none."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from sqlalchemy import text

from taskline.jobs import new_job_id
from taskline.store import bulk
from taskline.store.store import Store

COMPARED = ("type", "queue", "payload", "priority", "status", "attempts", "max_retries",
            "timeout_s", "idempotency_key", "request_hash", "last_error", "result",
            "cancel_requested", "trace_context")
RUN_AT = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def rows(count: int) -> list[dict[str, Any]]:
    """`count` insert rows that vary every field the API sets (as Enqueuer builds them)."""
    payloads = [{"i": 1}, {"big": 10**30, "text": "été 😀\t\\n", "x": [1.5, -0.0, None, True]},
                [1, {"z": 1, "a": 2}], "s", {}, 12]
    out = []
    for i in range(count):
        delay = 0.0 if i % 3 else 30.25
        run_at = RUN_AT if i % 7 == 0 else None
        out.append({"id": new_job_id(), "type": f"t{i % 4}", "queue": ("default", "q2")[i % 2],
                    "payload": payloads[i % len(payloads)], "priority": i % 10,
                    "status": "scheduled" if delay or run_at else "queued",
                    "max_retries": i % 5, "timeout_s": 1.5 + i, "run_at": run_at,
                    "delay_s": delay, "idempotency_key": None,
                    "request_hash": None if i % 2 else f"h{i}",
                    "trace_context": None if i % 5 else f"00-{i:032x}-{i:016x}-01"})
    return out


def stored(store: Store, ids: list) -> list[dict[str, Any]]:
    """The jobs rows of `ids` in that order, each with its events as (attempt, event)."""
    with store.engine.connect() as conn:
        jobs = {r.id: r._asdict() for r in conn.execute(
            text("SELECT * FROM taskline.jobs WHERE id = ANY(:ids)"), {"ids": ids})}
        for r in conn.execute(text("SELECT job_id, attempt, event FROM taskline.job_events "
                                   "WHERE job_id = ANY(:ids) ORDER BY id"), {"ids": ids}):
            jobs[r.job_id].setdefault("events", []).append((r.attempt, r.event))
    return [jobs[i] for i in ids]


def test_copy_writes_the_rows_the_statement_writes(store: Store) -> None:
    by_copy, by_statement = rows(bulk.COPY_MIN_JOBS), rows(bulk.COPY_MIN_JOBS)
    assert bulk.copyable(by_copy)
    returned = store.insert_jobs_with_events(by_copy)
    with store.transaction() as conn:  # a caller's transaction always takes the statement
        store.insert_jobs_with_events(by_statement, conn)
    copied = stored(store, [r["id"] for r in by_copy])
    inserted = stored(store, [r["id"] for r in by_statement])
    for row, a, b in zip(by_copy, copied, inserted, strict=True):
        assert {k: a[k] for k in COMPARED} == {k: b[k] for k in COMPARED}
        assert a["events"] == b["events"] == [(0, "scheduled" if a["status"] == "scheduled"
                                                else "enqueued")]
        if row["run_at"] is not None:
            assert a["next_run_at"] == b["next_run_at"] == RUN_AT
        else:
            assert a["next_run_at"] - a["created_at"] == b["next_run_at"] - b["created_at"]
    assert {r["created_at"] for r in copied} == {r["updated_at"] for r in copied}
    assert len({r["created_at"] for r in copied}) == 1  # one transaction's now()
    got = {r.id: r for r in returned}
    assert list(got) == [r["id"] for r in by_copy]
    for row in copied:
        assert (got[row["id"]].payload, got[row["id"]].next_run_at, got[row["id"]].created_at,
                got[row["id"]].updated_at) == (row["payload"], row["next_run_at"],
                                               row["created_at"], row["updated_at"])


def test_text_ids_are_taken_and_returned_as_uuids(store: Store) -> None:
    batch = rows(bulk.COPY_MIN_JOBS)
    for row in batch:
        row["id"] = str(row["id"])
    returned = store.insert_jobs_with_events(batch)
    assert [str(r.id) for r in returned] == [r["id"] for r in batch]
    assert len(stored(store, [r.id for r in returned])) == len(batch)


def test_small_or_keyed_batches_take_the_statement(store: Store) -> None:
    small, keyed = rows(bulk.COPY_MIN_JOBS - 1), rows(bulk.COPY_MIN_JOBS)
    keyed[-1]["idempotency_key"] = "k"
    assert not bulk.copyable(small) and not bulk.copyable(keyed)
    store.insert_jobs_with_events([{**keyed[-1], "id": new_job_id()}])
    assert len(store.insert_jobs_with_events(small)) == len(small)
    skipped = store.insert_jobs_with_events(keyed)  # its keyed job exists: skipped, not failed
    assert {r.id for r in skipped} == {r["id"] for r in keyed[:-1]}


def test_a_refused_row_writes_nothing_and_the_connection_is_replaced(store: Store) -> None:
    batch = rows(2 * bulk.COPY_MIN_JOBS)
    batch[-1]["priority"] = 42  # past the CHECK: the second half of the stream fails
    with pytest.raises(psycopg.errors.CheckViolation):
        store.insert_jobs_with_events(batch)
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM taskline.jobs")).scalar_one() == 0
        assert conn.execute(text("SELECT count(*) FROM taskline.job_events")).scalar_one() == 0
    again = rows(bulk.COPY_MIN_JOBS)
    assert len(store.insert_jobs_with_events(again)) == len(again)


def test_a_scheduled_job_is_due_by_postgresql_time(store: Store) -> None:
    batch = rows(bulk.COPY_MIN_JOBS)
    before = store.now()
    returned = {r.id: r for r in store.insert_jobs_with_events(batch)}
    for row in batch:
        due = returned[row["id"]].next_run_at
        if row["run_at"] is not None:
            assert due == RUN_AT
        else:
            assert due - returned[row["id"]].created_at == timedelta(seconds=row["delay_s"])
            assert due >= before
