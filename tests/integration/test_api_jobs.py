"""Reading, listing, cancelling and requeuing jobs through the API (real PostgreSQL and Redis).

Jobs are put in the states under test through Store calls (claim, settle) as a worker would,
so the API is checked against the same transitions the other services make.
"""

from __future__ import annotations

from typing import Any

import pytest
from flask.testing import FlaskClient

from taskline.dispatch.dispatcher import Dispatcher
from taskline.dispatch.keys import QueueKeys
from taskline.jobs import Job
from taskline.settings import Settings
from taskline.store.store import Claimed, Store
from taskline_producer.app import close_app, create_app
from tests.helpers import fail

WORKER = "worker-test-1"


def post(client: FlaskClient, **fields: Any) -> dict:
    r = client.post("/api/v1/jobs", json={"type": "echo", **fields})
    assert r.status_code == 201, r.get_json()
    return r.get_json()


def claim(store: Store, dispatcher: Dispatcher, job_id: str, queue: str = "default") -> Claimed:
    fetched = dispatcher.fetch(queue, WORKER, 10)
    assert job_id in fetched
    claimed = store.claim_jobs([job_id], WORKER, lease_s=30)
    assert len(claimed) == 1
    return claimed[0]


def make_dead(store: Store, dispatcher: Dispatcher, job_id: str, error: str = "boom") -> Job:
    claimed = claim(store, dispatcher, job_id)
    row = fail(store, claimed.lease_id, WORKER, error)
    assert row is not None
    dispatcher.dead_letter(claimed.job.queue, WORKER, job_id)
    return claimed.job


def assert_error(response: Any, status: int, code: str) -> dict:
    assert response.status_code == status, response.get_data(as_text=True)
    error = response.get_json()["error"]
    assert error["code"] == code and set(error) == {"code", "message", "details"}
    return error


# --- GET /jobs/{id} -------------------------------------------------------------------------

def test_get_job_shows_history_attempts_and_lease(client: FlaskClient, store: Store,
                                                  dispatcher: Dispatcher) -> None:
    job = post(client, payload={"x": 1})
    claimed = claim(store, dispatcher, job["id"])
    detail = client.get(f"/api/v1/jobs/{job['id']}").get_json()
    assert detail["status"] == "running" and detail["attempts"] == 1
    assert [e["event"] for e in detail["events"]] == ["enqueued", "claimed"]
    assert detail["events"][1]["worker_id"] == WORKER
    assert len(detail["leases"]) == 1
    assert detail["lease"]["id"] == claimed.lease_id
    assert detail["lease"]["worker_id"] == WORKER and detail["lease"]["released_at"] is None


def test_finished_attempts_have_no_current_lease(client: FlaskClient, store: Store,
                                                 dispatcher: Dispatcher) -> None:
    job = post(client)
    make_dead(store, dispatcher, job["id"])
    detail = client.get(f"/api/v1/jobs/{job['id']}").get_json()
    assert detail["lease"] is None
    assert detail["leases"][0]["outcome"] == "failed"
    assert detail["last_error"] == "boom"


NOT_FOUND_IDS = ["00000000-0000-4000-8000-000000000000", "nope", "1%3B%20--", "%00", "x" * 500,
                 "12345678123456781234567812345678a"]


def test_unknown_and_non_uuid_ids_are_404(client: FlaskClient) -> None:
    for job_id in NOT_FOUND_IDS:
        for response in (client.get(f"/api/v1/jobs/{job_id}"),
                         client.delete(f"/api/v1/jobs/{job_id}"),
                         client.post(f"/api/v1/jobs/{job_id}/retry")):
            assert_error(response, 404, "not_found")


def test_non_uuid_ids_are_404_before_any_sql(settings: Settings, unused_port: int) -> None:
    """With PostgreSQL unreachable a non-UUID is still a 404, so no SQL ran for it."""
    app = create_app(settings.replace(
        database_url=f"postgresql://root@127.0.0.1:{unused_port}/nowhere"))
    try:
        client = app.test_client()
        assert_error(client.get("/api/v1/jobs/not-a-uuid"), 404, "not_found")
        assert_error(client.delete("/api/v1/jobs/not-a-uuid"), 404, "not_found")
    finally:
        close_app(app)




# --- GET /jobs ------------------------------------------------------------------------------

def test_list_filters(client: FlaskClient, store: Store, dispatcher: Dispatcher) -> None:
    a = post(client, queue="mail")
    b = post(client, type="resize")
    c = post(client, type="resize", queue="mail")
    make_dead(store, dispatcher, b["id"])

    def ids(query: str) -> set[str]:
        r = client.get(f"/api/v1/jobs?{query}")
        assert r.status_code == 200
        return {j["id"] for j in r.get_json()["jobs"]}

    assert ids("") == {a["id"], b["id"], c["id"]}
    assert ids("queue=mail") == {a["id"], c["id"]}
    assert ids("type=resize") == {b["id"], c["id"]}
    assert ids("type=resize&queue=mail") == {c["id"]}
    assert ids("status=dead") == {b["id"]}
    assert ids("status=queued&type=resize") == {c["id"]}
    assert ids("status=succeeded") == set()


def test_cursor_pagination_walks_every_job_once_newest_first(client: FlaskClient) -> None:
    created = [post(client, payload={"i": i})["id"] for i in range(7)]
    pages, cursor = [], None
    while True:
        query = "limit=3" + (f"&cursor={cursor}" if cursor else "")
        page = client.get(f"/api/v1/jobs?{query}").get_json()
        pages.append([j["id"] for j in page["jobs"]])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert [len(p) for p in pages] == [3, 3, 1]
    assert [job_id for page in pages for job_id in page] == list(reversed(created))


def test_exact_last_page_has_no_cursor(client: FlaskClient) -> None:
    for _ in range(2):
        post(client)
    page = client.get("/api/v1/jobs?limit=2").get_json()
    assert len(page["jobs"]) == 2 and page["next_cursor"] is None


BAD_LIST_QUERIES = ["status=bogus", "status=", "limit=0", "limit=501", "limit=ten", "limit=-1",
                    "cursor=garbage", "cursor=", "type=", "type=a%00b", "queue=bad%20name",
                    "queue="]


def test_invalid_list_parameters_are_400(client: FlaskClient) -> None:
    for query in BAD_LIST_QUERIES:
        error = assert_error(client.get(f"/api/v1/jobs?{query}"), 400, "invalid_parameter")
        assert error["details"]["parameter"] == query.split("=")[0], query


# --- DELETE /jobs/{id} ----------------------------------------------------------------------

def test_cancel_queued_job(client: FlaskClient, store: Store) -> None:
    job = post(client)
    r = client.delete(f"/api/v1/jobs/{job['id']}")
    assert r.status_code == 200 and r.get_json()["status"] == "cancelled"
    events, _ = store.get_history(job["id"])
    assert [e["event"] for e in events] == ["enqueued", "cancelled"]


def test_cancel_scheduled_job_leaves_the_scheduled_set(client: FlaskClient, store: Store,
                                                       dispatcher: Dispatcher) -> None:
    job = post(client, delay_s=600)
    key = QueueKeys("default").scheduled
    assert dispatcher.client.zscore(key, job["id"]) is not None
    r = client.delete(f"/api/v1/jobs/{job['id']}")
    assert r.status_code == 200 and r.get_json()["status"] == "cancelled"
    assert dispatcher.client.zscore(key, job["id"]) is None
    assert store.get_job(job["id"]).status == "cancelled"


def test_cancel_running_job_asks_it_to_stop(client: FlaskClient, store: Store,
                                            dispatcher: Dispatcher) -> None:
    job = post(client)
    claimed = claim(store, dispatcher, job["id"])
    r = client.delete(f"/api/v1/jobs/{job['id']}")
    assert r.status_code == 202
    assert r.get_json()["status"] == "running" and r.get_json()["cancel_requested"] is True
    assert store.renew_leases([claimed.lease_id], WORKER, 30) == {claimed.lease_id: True}


@pytest.mark.parametrize("terminal", ["dead", "cancelled"])
def test_cancel_terminal_job_is_409(client: FlaskClient, store: Store, dispatcher: Dispatcher,
                                    terminal: str) -> None:
    job = post(client)
    if terminal == "dead":
        make_dead(store, dispatcher, job["id"])
    else:
        client.delete(f"/api/v1/jobs/{job['id']}")
    error = assert_error(client.delete(f"/api/v1/jobs/{job['id']}"), 409, "invalid_state")
    assert error["details"]["status"] == terminal


# --- POST /jobs/{id}/retry and GET /dlq -----------------------------------------------------

def test_retry_dead_job_requeues_it(client: FlaskClient, store: Store,
                                    dispatcher: Dispatcher) -> None:
    job = post(client, priority=8)
    make_dead(store, dispatcher, job["id"])
    keys = QueueKeys("default")
    assert dispatcher.client.lrange(keys.dlq, 0, -1) == [job["id"]]
    r = client.post(f"/api/v1/jobs/{job['id']}/retry")
    assert r.status_code == 200
    requeued = r.get_json()
    assert (requeued["status"], requeued["attempts"], requeued["last_error"]) == (
        "queued", 0, None)
    assert dispatcher.client.lrange(keys.dlq, 0, -1) == []
    assert dispatcher.client.lrange(keys.ready(8), 0, -1) == [job["id"]]
    assert client.get("/api/v1/dlq").get_json()["jobs"] == []


def test_retry_of_a_job_that_is_not_dead_is_409(client: FlaskClient) -> None:
    job = post(client)
    error = assert_error(client.post(f"/api/v1/jobs/{job['id']}/retry"), 409, "invalid_state")
    assert error["details"]["status"] == "queued"


def test_dlq_lists_final_error_and_pages(client: FlaskClient, store: Store,
                                         dispatcher: Dispatcher) -> None:
    dead = []
    for i in range(3):
        job = post(client, queue="default")
        make_dead(store, dispatcher, job["id"], error=f"error {i}")
        dead.append(job["id"])
    post(client)  # alive: not listed
    first = client.get("/api/v1/dlq?limit=2").get_json()
    second = client.get(f"/api/v1/dlq?limit=2&cursor={first['next_cursor']}").get_json()
    entries = first["jobs"] + second["jobs"]
    assert second["next_cursor"] is None
    assert [e["job"]["id"] for e in entries] == list(reversed(dead))
    assert [e["final_error"] for e in entries] == ["error 2", "error 1", "error 0"]
    assert all(e["attempts"] == 1 for e in entries)
    assert client.get("/api/v1/dlq?queue=elsewhere").get_json()["jobs"] == []


def test_invalid_dlq_parameters_are_400(client: FlaskClient) -> None:
    for query in ("limit=0", "cursor=zzz", "queue=%20"):
        assert_error(client.get(f"/api/v1/dlq?{query}"), 400, "invalid_parameter")
