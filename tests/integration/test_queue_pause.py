"""Queue pause against real PostgreSQL and Redis: the claim rule refuses jobs of a paused queue
(whichever way their ids arrive), ids fetched around a pause go back to Redis in order, running
workers and a worker started later honour a pause, a resume wakes them, maintenance repairs a
lost or stale marker, and the API persists, shows and audits pauses."""

from __future__ import annotations

import time
import uuid

import pytest
from sqlalchemy import text

from taskline.dispatch.keys import QueueKeys
from taskline_maintenance.pauses import PauseMarkers
from tests.helpers import enqueue, wait_for
from tests.integration import worker_handlers as th
from tests.integration.worker_handlers import running_worker

pytestmark = pytest.mark.usefixtures("clean_handlers")

WORKER = "w-pause"


def test_claim_refuses_jobs_of_a_paused_queue_and_takes_them_after_resume(store, dispatcher):
    paused = enqueue(store, dispatcher, "t.record", queue="reports", push=False)
    other = enqueue(store, dispatcher, "t.record", queue="default", push=False)
    assert store.pause_queue("reports", "ops") is not None
    won = store.claim_jobs([paused.id, other.id], WORKER, 30)
    assert [c.job.id for c in won] == [other.id]
    refused = store.claim_refusals([paused.id, other.id])
    assert [(r.id, r.paused, r.limited) for r in refused] == [(paused.id, True, False)]
    assert store.get_job(paused.id).status.value == "queued"
    assert store.get_job(paused.id).attempts == 0
    assert store.resume_queue("reports") is not None
    assert [c.job.id for c in store.claim_jobs([paused.id], WORKER, 30)] == [paused.id]


def test_pause_and_resume_are_idempotent(store):
    assert store.pause_queue("q1", "a") is not None
    assert store.pause_queue("q1", "b") is None
    assert store.paused_queues()["q1"]["actor"] == "a"
    assert store.resume_queue("q1") is not None
    assert store.resume_queue("q1") is None
    assert store.paused_queues() == {}


def test_fetch_takes_nothing_while_the_marker_is_set(store, dispatcher):
    job = enqueue(store, dispatcher, "t.record", queue="reports")
    dispatcher.mark_paused("reports", True)
    assert dispatcher.fetch("reports", WORKER, 10) == []
    dispatcher.mark_paused("reports", False)
    assert dispatcher.fetch("reports", WORKER, 10) == [str(job.id)]


def test_ids_fetched_without_a_marker_go_back_in_order(settings, store, dispatcher):
    """Redis lost the marker (flushed): the claim refuses, the ids return to their ready list in
    fetch order, the marker is restored briefly, and nothing ran or consumed an attempt."""
    jobs = [enqueue(store, dispatcher, "t.record", {"tag": str(i)}, queue="default")
            for i in range(5)]
    store.pause_queue("default", None)
    with running_worker(settings, concurrency=2):
        wait_for(lambda: dispatcher.client.exists(QueueKeys("default").paused),
                 message="the worker restored the marker")
        time.sleep(0.3)
        ready = dispatcher.list_range(QueueKeys("default").ready(5), 0, -1)
        assert list(reversed(ready)) == [str(j.id) for j in jobs]  # taken from the right
        assert th.tags() == []
        assert all(store.get_job(j.id).attempts == 0 for j in jobs)
        store.resume_queue("default")
        dispatcher.mark_paused("default", False)
        wait_for(lambda: len(th.tags()) == 5, message="all run after resume")
    assert th.tags() == [str(i) for i in range(5)]


def test_running_workers_start_nothing_after_a_pause_and_resume_promptly(settings, store,
                                                                        dispatcher, client):
    with running_worker(settings, concurrency=2):
        for i in range(3):
            enqueue(store, dispatcher, "t.record", {"tag": f"before-{i}"})
        wait_for(lambda: len(th.tags()) == 3, message="jobs run before the pause")
        assert client.post("/api/v1/queues/default/pause").status_code == 200
        paused_at = time.monotonic()
        later = [enqueue(store, dispatcher, "t.record", {"tag": f"after-{i}"})
                 for i in range(10)]
        time.sleep(1.5)
        assert len(th.tags()) == 3, "a job started while its queue was paused"
        assert all(store.get_job(j.id).status.value == "queued" for j in later)
        assert time.monotonic() - paused_at >= 1.5
        resumed = time.monotonic()
        assert client.post("/api/v1/queues/default/resume").status_code == 200
        wait_for(lambda: len(th.tags()) == 13, timeout=5, message="resumed jobs run")
        assert time.monotonic() - resumed < 1.0, "resume took more than a second"


def test_a_worker_started_while_paused_waits_for_resume(settings, store, dispatcher, client):
    client.post("/api/v1/queues/default/pause")
    jobs = [enqueue(store, dispatcher, "t.record", {"tag": str(i)}) for i in range(4)]
    with running_worker(settings, concurrency=2):
        time.sleep(1.2)
        assert th.tags() == []
        client.post("/api/v1/queues/default/resume")
        wait_for(lambda: len(th.tags()) == 4, message="jobs run after resume")
    assert all(store.get_job(j.id).status.value == "succeeded" for j in jobs)


def test_maintenance_writes_lost_markers_and_removes_stale_ones(store, dispatcher):
    enqueue(store, dispatcher, "t.record", queue="kept")
    enqueue(store, dispatcher, "t.record", queue="resumed")
    store.pause_queue("kept", None)
    dispatcher.mark_paused("resumed", True)  # left behind by a resume whose Redis write failed
    markers = PauseMarkers(store, dispatcher)
    result = markers.run_once()
    assert (result.paused, result.written, result.removed) == (1, 1, 1)
    assert dispatcher.paused_markers(["kept", "resumed"]) == {"kept"}
    assert markers.run_once().written == 0


def test_api_pause_shows_in_queues_even_for_an_empty_queue(client, store):
    response = client.post("/api/v1/queues/nightly/pause")
    assert response.status_code == 200
    assert response.get_json()["paused"] is True
    queues = {q["name"]: q for q in client.get("/api/v1/queues").get_json()["queues"]}
    assert queues["nightly"]["paused"] is True
    assert queues["nightly"]["paused_at"] is not None
    again = client.post("/api/v1/queues/nightly/pause").get_json()
    assert again["paused_at"] == response.get_json()["paused_at"]
    assert client.post("/api/v1/queues/nightly/resume").get_json()["paused"] is False
    queues = {q["name"]: q for q in client.get("/api/v1/queues").get_json()["queues"]}
    assert "nightly" not in queues or queues["nightly"]["paused"] is False
    actions = [r["action"] for r in client.get("/api/v1/audit").get_json()["records"]]
    assert actions.count("queue.pause") == 1 and actions.count("queue.resume") == 1


@pytest.mark.parametrize("name", ["bad name", "x" * 65, "semi;colon"])
def test_invalid_queue_names_are_refused_and_change_nothing(client, store, name):
    response = client.post(f"/api/v1/queues/{name}/pause")
    assert response.status_code == 400
    assert response.get_json()["error"]["code"] == "invalid_parameter"
    assert store.paused_queues() == {}


def test_the_claim_reads_candidates_through_the_view(store):
    with store.transaction() as conn:
        plan = "\n".join(r[0] for r in conn.execute(text(
            "EXPLAIN SELECT c.id FROM taskline.claimable_jobs c WHERE c.id = ANY(:ids)"),
            {"ids": [str(uuid.uuid4())]}))
    assert "Seq Scan on jobs" not in plan, plan
