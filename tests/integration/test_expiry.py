"""Expiring jobs against real PostgreSQL: a job not started by its `expires_at` (or
`start_within_s`) is never leased (the claim refuses it in PostgreSQL's clock) and maintenance's
lapser cancels it with the event `lapsed` from queued, scheduled or retrying, while a running
job is not affected; a workflow step counts `start_within_s` from its release; bad expiries are
a 422 naming the field, nothing written."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from sqlalchemy import text

import taskline
from taskline import transitions
from taskline.store.rows import Settlement
from taskline_maintenance.lapser import Lapser
from tests.helpers import enqueue, fail

W = "w-exp"


def expire_now(store, job_id) -> None:
    with store.transaction() as conn:
        conn.execute(text("UPDATE taskline.jobs SET expires_at = clock_timestamp() "
                          "WHERE id = :id"), {"id": job_id})


def events(store, job_id) -> list[str]:
    with store.transaction() as conn:
        return list(conn.execute(text("SELECT event FROM taskline.job_events WHERE job_id = :id "
                                      "ORDER BY id"), {"id": job_id}).scalars().all())


def test_the_claim_refuses_a_lapsed_job_and_the_lapser_cancels_it(store, dispatcher):
    job = enqueue(store, None, "t", push=False)
    expire_now(store, job.id)
    assert store.claim_jobs([job.id], W, 30) == []
    assert store.claim_due_jobs(["default"], 10, W, 30) == []
    assert Lapser(store, dispatcher).run_once().lapsed == 1
    lapsed = store.get_job(job.id)
    assert (lapsed.status.value, lapsed.attempts) == ("cancelled", 0)
    assert events(store, job.id) == ["enqueued", "lapsed"]


def test_scheduled_and_retrying_jobs_lapse_and_a_running_one_is_left_alone(store, dispatcher):
    scheduled, retrying, running = (enqueue(store, None, "t", push=False) for _ in range(3))
    (claim,) = store.claim_jobs([retrying.id], W, 30)
    fail(store, claim.lease_id, W, delay_s=60)
    (live,) = store.claim_jobs([running.id], W, 30)
    with store.transaction() as conn:
        conn.execute(text("UPDATE taskline.jobs SET status = 'scheduled', "
                          "next_run_at = now() + interval '1 hour' WHERE id = :id"),
                     {"id": scheduled.id})
    for job in (scheduled, retrying, running):
        expire_now(store, job.id)
    assert Lapser(store, dispatcher).run_once().lapsed == 2
    assert store.get_job(scheduled.id).status.value == "cancelled"
    assert store.get_job(retrying.id).status.value == "cancelled"
    assert store.get_job(running.id).status.value == "running"
    store.settle([Settlement(live.lease_id, W, transitions.succeeded(None))])
    assert store.get_job(running.id).status.value == "succeeded"


def test_start_within_s_counts_from_the_enqueue_and_is_shown(client, store, dispatcher):
    made = client.post("/api/v1/jobs", json={"type": "t", "start_within_s": 0.2})
    assert made.status_code == 201, made.get_json()
    job = made.get_json()
    created = datetime.fromisoformat(job["created_at"])
    assert datetime.fromisoformat(job["expires_at"]) == created + timedelta(seconds=0.2)
    assert client.get(f"/api/v1/jobs/{job['id']}").get_json()["expires_at"] == job["expires_at"]
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    kept = client.post("/api/v1/jobs", json={"type": "t", "expires_at": later}).get_json()
    time.sleep(0.3)
    Lapser(store, dispatcher).run_once()
    assert client.get(f"/api/v1/jobs/{job['id']}").get_json()["status"] == "cancelled"
    assert client.get(f"/api/v1/jobs/{kept['id']}").get_json()["status"] == "queued"


def test_a_copy_written_batch_and_the_library_carry_the_expiry(client, store, database_url):
    answer = client.post("/api/v1/jobs/batch", json={"jobs": [
        {"type": "t", "start_within_s": 60} for _ in range(120)]})
    assert answer.status_code == 201
    with psycopg.connect(database_url) as conn:
        lib = taskline.enqueue(conn, "t", start_within_s=60)
    with store.transaction() as conn:
        missing = conn.execute(text("SELECT count(*) FROM taskline.jobs "
                                    "WHERE expires_at IS NULL")).scalar_one()
    assert missing == 0 and store.get_job(lib).expires_at is not None


def test_a_step_counts_start_within_s_from_its_release(client, store, dispatcher):
    made = client.post("/api/v1/workflows", json={"name": "w", "steps": [
        {"id": "a", "job": {"type": "t"}},
        {"id": "b", "job": {"type": "t", "start_within_s": 30}, "after": ["a"]}]})
    assert made.status_code == 201, made.get_json()
    steps = {s["id"]: s["job_id"] for s in made.get_json()["steps"]}
    assert store.get_job(steps["b"]).expires_at is None  # waiting: not counting yet
    (a,) = store.claim_jobs([steps["a"]], W, 30)
    store.settle([Settlement(a.lease_id, W, transitions.succeeded(None), releases=True)])
    b = store.get_job(steps["b"])
    assert b.status.value == "queued"
    assert timedelta(seconds=29) < b.expires_at - b.updated_at <= timedelta(seconds=30)
    refused = client.post("/api/v1/workflows", json={"name": "x", "steps": [
        {"id": "a", "job": {"type": "t", "expires_at": "2100-01-01T00:00:00Z"}}]})
    assert refused.status_code == 422
    assert "expires_at" in str(refused.get_json())


@pytest.mark.parametrize("body, field", [
    ({"expires_at": "2000-01-01T00:00:00Z"}, "expires_at"),
    ({"expires_at": "soon"}, "expires_at"),
    ({"start_within_s": 0}, "start_within_s"),
    ({"start_within_s": "10"}, "start_within_s"),
    ({"start_within_s": 5, "expires_at": "2100-01-01T00:00:00Z"}, "start_within_s"),
])
def test_bad_expiries_are_a_422_naming_the_field_and_nothing_is_written(client, store, body,
                                                                        field):
    answer = client.post("/api/v1/jobs", json={"type": "t", **body})
    assert answer.status_code == 422
    assert any(d["field"] == field for d in answer.get_json()["error"]["details"])
    with store.transaction() as conn:
        assert conn.execute(text("SELECT count(*) FROM taskline.jobs")).scalar_one() == 0
