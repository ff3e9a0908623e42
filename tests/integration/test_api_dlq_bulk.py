"""Bulk dead-letter operations: POST /api/v1/dlq/retry and /purge against real PostgreSQL and
Redis. Filters combine with AND, `limit` bounds a call and `remaining` counts the rest; two
concurrent requeues requeue each job exactly once; a purge deletes each job whole; bad input is
a 422 with the error shape and changes nothing."""

from __future__ import annotations

import threading
import uuid
from collections import Counter

import pytest
from flask import Flask
from sqlalchemy import text

from taskline.dispatch.dispatcher import Dispatcher
from taskline.dispatch.keys import QueueKeys
from taskline.store.store import Store
from taskline_producer.operations import bulkdlq
from tests.helpers import make_dead


def rows(store: Store, sql: str, **params) -> list:
    with store.transaction() as conn:
        return conn.execute(text(sql), params).all()


def statuses(store: Store) -> Counter:
    return Counter(r.status for r in rows(store, "SELECT status FROM taskline.jobs"))


def ready(dispatcher: Dispatcher, queue: str) -> list[str]:
    return [i for key in QueueKeys(queue).ready_by_urgency
            for i in dispatcher.list_range(key, 0, -1)]


def test_retry_requeues_matching_jobs_up_to_the_limit(client, store, dispatcher):
    mail = make_dead(store, dispatcher, 5, queue="q1", job_type="mail")
    make_dead(store, dispatcher, 3, queue="q1", job_type="sms")
    make_dead(store, dispatcher, 2, queue="q2", job_type="mail")
    answer = client.post("/api/v1/dlq/retry", json={"queue": "q1", "type": "mail", "limit": 3})
    assert answer.status_code == 200 and answer.get_json() == {"requeued": 3, "remaining": 2}
    rest = client.post("/api/v1/dlq/retry", json={"queue": "q1", "type": "mail"})
    assert rest.get_json() == {"requeued": 2, "remaining": 0}
    assert statuses(store) == Counter({"queued": 5, "dead": 5})
    assert sorted(ready(dispatcher, "q1")) == sorted(mail)
    assert not set(mail) & set(dispatcher.list_range(QueueKeys("q1").dlq, 0, -1))
    requeued = rows(store, "SELECT job_id, attempts FROM taskline.dead_letter_jobs")
    assert len(requeued) == 5 and not set(mail) & {str(r.job_id) for r in requeued}
    events = rows(store, "SELECT actor FROM taskline.job_events WHERE event = 'requeued'")
    assert len(events) == 5
    audit = rows(store, "SELECT action, detail FROM taskline.audit_log ORDER BY at")
    assert [a.action for a in audit] == ["dlq.retry", "dlq.retry"]
    assert audit[0].detail["jobs"] == 3 and audit[0].detail["queue"] == "q1"


def test_retry_by_ids(client, store, dispatcher):
    ids = make_dead(store, dispatcher, 4)
    answer = client.post("/api/v1/dlq/retry", json={"ids": [*ids[:2], str(uuid.uuid4())]})
    assert answer.get_json() == {"requeued": 2, "remaining": 0}
    assert statuses(store) == Counter({"queued": 2, "dead": 2})


def test_two_concurrent_requeues_requeue_each_job_exactly_once(app: Flask, store, dispatcher,
                                                               monkeypatch):
    monkeypatch.setattr(bulkdlq, "BATCH_SIZE", 50)  # many batches each, interleaved
    ids = make_dead(store, dispatcher, 1200)
    answers: list[dict] = []
    barrier = threading.Barrier(2)

    def call() -> None:
        client = app.test_client()
        barrier.wait()
        answers.append(client.post("/api/v1/dlq/retry", json={"queue": "q1"}).get_json())

    threads = [threading.Thread(target=call) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(answers) == 2 and sum(a["requeued"] for a in answers) <= 1200
    # Whatever one call skipped while the other held it, a last call finishes the rest.
    answers.append(app.test_client().post("/api/v1/dlq/retry", json={"queue": "q1"}).get_json())
    assert sum(a["requeued"] for a in answers) == 1200 and answers[-1]["remaining"] == 0
    per_job = Counter(str(r.job_id) for r in rows(
        store, "SELECT job_id FROM taskline.job_events WHERE event = 'requeued'"))
    assert set(per_job) == set(ids) and set(per_job.values()) == {1}
    pushed = Counter(ready(dispatcher, "q1"))
    assert set(pushed) == set(ids) and set(pushed.values()) == {1}


def test_purge_deletes_matching_dead_jobs_whole(client, store, dispatcher):
    doomed = make_dead(store, dispatcher, 6, job_type="mail")
    kept = make_dead(store, dispatcher, 2, job_type="sms")
    answer = client.post("/api/v1/dlq/purge", json={"type": "mail", "limit": 4})
    assert answer.get_json() == {"purged": 4, "remaining": 2}
    assert client.post("/api/v1/dlq/purge", json={"type": "mail"}).get_json() == {
        "purged": 2, "remaining": 0}
    left = {str(r.id) for r in rows(store, "SELECT id FROM taskline.jobs")}
    assert left == set(kept)
    found = rows(store, "SELECT job_id FROM taskline.dead_letter_jobs")
    assert {str(r.job_id) for r in found} == set(kept)
    # A purged job's events and leases go with their partition (migration 0021).
    for table in ("job_events", "job_leases"):
        found = rows(store, f"SELECT job_id FROM taskline.{table}")
        assert {str(r.job_id) for r in found} == set(kept) | set(doomed)
    assert set(dispatcher.list_range(QueueKeys("q1").dlq, 0, -1)) == set(kept)
    assert client.get(f"/api/v1/jobs/{doomed[0]}").status_code == 404
    assert [a.action for a in rows(store, "SELECT action FROM taskline.audit_log")] == [
        "dlq.purge", "dlq.purge"]


def test_only_dead_jobs_are_touched(client, store, dispatcher):
    (job_id,) = make_dead(store, dispatcher, 1)
    # A job that is no longer dead but kept its DLQ row by accident is still not dead.
    with store.transaction() as conn:
        conn.execute(text("UPDATE taskline.jobs SET status = 'succeeded'"))
    assert client.post("/api/v1/dlq/purge", json={"ids": [job_id]}).get_json() == {
        "purged": 0, "remaining": 0}
    assert client.post("/api/v1/dlq/retry", json={"ids": [job_id]}).get_json() == {
        "requeued": 0, "remaining": 0}
    assert statuses(store) == Counter({"succeeded": 1})


@pytest.mark.parametrize("body", [
    {}, {"limit": 5}, {"queue": None}, {"queue": "bad queue"}, {"queue": "x" * 65},
    {"type": ""}, {"type": 5}, {"ids": []}, {"ids": ["not-a-uuid"]}, {"ids": "abc"},
    {"queue": "q1", "limit": 0}, {"queue": "q1", "limit": 10001}, {"queue": "q1", "limit": True},
    {"queue": "q1", "limit": "5"}, {"queue": "q1", "status": "dead"}, [], "q1",
])
@pytest.mark.parametrize("route", ["retry", "purge"])
def test_bad_input_is_refused_and_changes_nothing(client, store, dispatcher, body, route):
    make_dead(store, dispatcher, 2)
    answer = client.post(f"/api/v1/dlq/{route}", json=body)
    assert answer.status_code == 422, answer.get_data(as_text=True)
    error = answer.get_json()["error"]
    assert set(error) == {"code", "message", "details"} and error["code"] == "validation_failed"
    assert statuses(store) == Counter({"dead": 2})
    assert rows(store, "SELECT * FROM taskline.audit_log") == []


def test_wrong_content_type_is_415(client, store, dispatcher):
    make_dead(store, dispatcher, 1)
    answer = client.post("/api/v1/dlq/purge", data="queue=q1",
                         content_type="application/x-www-form-urlencoded")
    assert answer.status_code == 415 and statuses(store) == Counter({"dead": 1})
