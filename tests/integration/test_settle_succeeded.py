"""`settle_succeeded`, settle's special case for plain successes, against real PostgreSQL: the
same rows as `settle` of `transitions.succeeded` (job, lease, event, answer, finish signal)
and the same fence. The worker's recorder runs it for every batch of plain successes, so the
worker's own tests (test_worker_outcomes and the rest) go through it too."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from taskline import transitions
from taskline.store.rows import Settlement
from taskline.store.store import Claimed, Store
from tests.helpers import enqueue


def _claim(store: Store, dispatcher, n: int, worker: str = "w1") -> list[Claimed]:
    jobs = [enqueue(store, dispatcher, push=False) for _ in range(n)]
    claimed = store.claim_jobs([j.id for j in jobs], worker, 15.0)
    assert len(claimed) == n
    return sorted(claimed, key=lambda c: c.lease_id)


def _mark(database_url: str, ids: list[uuid.UUID]) -> None:
    """An earlier failure's last_error, and a waiter's flag, on each job."""
    with psycopg.connect(database_url) as conn:
        conn.execute("UPDATE taskline.jobs SET last_error = 'earlier', watched = true "
                     "WHERE id = ANY(%s)", (ids,))


def _state(database_url: str, job_id: uuid.UUID) -> dict[str, Any]:
    """What a settle leaves behind for one job, without its ids and instants (only whether
    the instants are set, and finished_at against updated_at)."""
    with psycopg.connect(database_url) as conn:
        job = conn.execute(
            "SELECT status, attempts, snoozes, result, result IS NULL AS result_is_sql_null, "
            "last_error, next_run_at = created_at AS due_unchanged, "
            "finished_at IS NOT NULL AND finished_at = updated_at AS finished "
            "FROM taskline.jobs WHERE id = %s", (job_id,)).fetchone()
        lease = conn.execute(
            "SELECT outcome, released_at IS NOT NULL, worker_id, attempt "
            "FROM taskline.job_leases WHERE job_id = %s", (job_id,)).fetchall()
        events = conn.execute(
            "SELECT event, attempt, worker_id, detail FROM taskline.job_events "
            "WHERE job_id = %s ORDER BY id", (job_id,)).fetchall()
        dead = conn.execute("SELECT count(*) FROM taskline.dead_letter_jobs WHERE job_id = %s",
                            (job_id,)).fetchone()[0]
    return {"job": job, "lease": lease, "events": events, "dead": dead}


def _answer(rows) -> list[tuple]:
    return [(r.queue, r.priority, r.attempts, r.status, r.worker_id, r.due_ms is not None,
             r.turn) for r in rows]


@pytest.mark.parametrize("result", [None, {"n": 1, "text": "ü"}, [1, 2], "done", 0])
def test_it_leaves_what_settle_leaves_for_a_success(store: Store, dispatcher, database_url,
                                                    result):
    general, lean = _claim(store, dispatcher, 2)
    _mark(database_url, [general.job.id, lean.job.id])
    with psycopg.connect(database_url, autocommit=True) as listen:
        listen.execute("LISTEN taskline_finished")
        by_settle = store.settle([Settlement(general.lease_id, "w1",
                                             transitions.succeeded(result))])
        by_lean = store.settle_succeeded([(lean.lease_id, result)], "w1")
        signalled = {n.payload for n in listen.notifies(timeout=1.0, stop_after=2)}
    assert [r.id for r in by_settle] == [general.job.id]
    assert [r.id for r in by_lean] == [lean.job.id]
    assert [r.lease_id for r in by_lean] == [lean.lease_id]
    assert _answer(by_lean) == _answer(by_settle)
    assert _state(database_url, lean.job.id) == _state(database_url, general.job.id)
    assert signalled == {str(general.job.id), str(lean.job.id)}  # both finishes signalled
    state = _state(database_url, lean.job.id)
    assert state["job"][0] == "succeeded" and state["job"][5] is None  # last_error cleared
    assert state["job"][3] == result and state["job"][4] is False  # JSON null, not SQL NULL
    assert [e[0] for e in state["events"]] == ["enqueued", "claimed", "succeeded"]


def test_a_batch_settles_each_lease_with_its_own_result(store: Store, dispatcher,
                                                        database_url):
    claimed = _claim(store, dispatcher, 5)
    results = [None, {"i": 1}, None, "three", {"i": 4}]
    rows = store.settle_succeeded([(c.lease_id, r) for c, r in zip(claimed, results,
                                                                    strict=True)], "w1")
    assert sorted(r.lease_id for r in rows) == [c.lease_id for c in claimed]
    for c, expected in zip(claimed, results, strict=True):
        job = store.get_job(c.job.id)
        assert job.status == "succeeded" and job.result == expected


def test_it_is_fenced_like_settle(store: Store, dispatcher, database_url):
    mine, theirs = _claim(store, dispatcher, 2)
    assert store.settle_succeeded([(mine.lease_id, None)], "intruder") == []
    assert store.get_job(mine.job.id).status == "running"
    # A batch settles only the leases that are live: one ended already, one another's.
    assert [r.id for r in store.settle_succeeded([(mine.lease_id, 1)], "w1")] == [mine.job.id]
    again = store.settle_succeeded([(mine.lease_id, 2), (theirs.lease_id, 3)], "w1")
    assert [r.id for r in again] == [theirs.job.id]
    assert store.get_job(mine.job.id).result == 1
    # A lease whose job another actor moved (a cancel of the running job finished it) is not
    # live either.
    (late,) = _claim(store, dispatcher, 1)
    with psycopg.connect(database_url) as conn:
        conn.execute("UPDATE taskline.jobs SET status = 'cancelled' WHERE id = %s",
                     (late.job.id,))
    assert store.settle_succeeded([(late.lease_id, None)], "w1") == []
    assert store.settle_succeeded([], "w1") == []
