"""The Python client against a real `taskline api` subprocess (real PostgreSQL and Redis).

Dead jobs and live workers are produced the way a worker produces them (claim, fail, dead-letter;
register), through the library's Store and Dispatcher, so these tests need no worker process.
The tests share one database and one API (tests/integration/conftest.py), so each names its
queues apart where it asserts on a whole list.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from taskline import JobCancelled, JobFailed
from taskline.client import Client, ClientError
from taskline.dispatch.dispatcher import Dispatcher
from taskline.settings import Settings
from taskline.store.store import Store
from tests.helpers import enqueue, fail, start_api

WORKER = "client-test-worker"


@pytest.fixture
def settings(module_settings: Settings, redis_url: str) -> Settings:
    return module_settings


@pytest.fixture
def api_url(module_api_url: str, redis_url: str) -> str:
    return module_api_url


@pytest.fixture
def client(api_url: str) -> Iterator[Client]:
    with Client(api_url, attempts=2) as c:
        yield c


def make_dead(store: Store, dispatcher: Dispatcher, queue: str = "default") -> str:
    """A job that failed its only attempt, recorded as the worker records it."""
    job = enqueue(store, dispatcher, "simulate", {"fail_first": 1}, queue=queue, max_retries=0)
    [fetched] = dispatcher.fetch(queue, WORKER, 1)
    [claimed] = store.claim_jobs([fetched], WORKER, 30)
    assert fail(store, claimed.lease_id, WORKER, "simulated failure") is not None
    dispatcher.dead_letter(queue, WORKER, fetched)
    return str(job.id)


def test_enqueue_get_and_list(client: Client) -> None:
    job = client.enqueue("echo", {"hello": "world"}, queue="emails", priority="high",
                         max_retries=1, timeout_s=5)
    assert job["status"] == "queued"
    assert (job["queue"], job["priority"], job["max_retries"]) == ("emails", 7, 1)
    detail = client.get(job["id"])
    assert detail["payload"] == {"hello": "world"}
    assert [e["event"] for e in detail["events"]] == ["enqueued"]
    page = client.list(queue="emails", status="queued")
    assert [j["id"] for j in page["jobs"]] == [job["id"]]
    assert client.list(queue="other")["jobs"] == []


def test_replayed_enqueue_returns_the_same_job(client: Client) -> None:
    first = client.enqueue("echo", {"n": 1}, queue="replays", idempotency_key="order-7")
    again = client.enqueue("echo", {"n": 1}, queue="replays", idempotency_key="order-7")
    assert again["id"] == first["id"]
    with pytest.raises(ClientError) as info:
        client.enqueue("echo", {"n": 2}, queue="replays", idempotency_key="order-7")
    assert (info.value.status, info.value.code) == (422, "idempotency_key_reused")
    assert len(client.list(queue="replays")["jobs"]) == 1


def test_delayed_job_is_scheduled(client: Client) -> None:
    job = client.enqueue("echo", delay_s=3600)
    assert job["status"] == "scheduled"


def test_list_pages_with_the_cursor(client: Client) -> None:
    ids = {client.enqueue("echo", {"i": i}, queue="pages")["id"] for i in range(3)}
    first = client.list(queue="pages", limit=2)
    assert len(first["jobs"]) == 2 and first["next_cursor"]
    second = client.list(queue="pages", limit=2, cursor=first["next_cursor"])
    assert second["next_cursor"] is None
    assert {j["id"] for j in first["jobs"] + second["jobs"]} == ids


def test_batch(client: Client) -> None:
    answer = client.enqueue_batch([{"type": "echo", "payload": {"i": 1}},
                                   {"type": "echo", "queue": "q2", "priority": 9}])
    assert answer["created"] == 2
    assert [item["job"]["queue"] for item in answer["jobs"]] == ["default", "q2"]


def test_cancel_then_wait_returns_at_once(client: Client) -> None:
    job = client.enqueue("echo")
    assert client.cancel(job["id"])["status"] == "cancelled"
    with pytest.raises(JobCancelled) as cancelled:
        client.wait(job["id"], timeout=5)
    assert cancelled.value.job["status"] == "cancelled"
    assert client.wait(job["id"], timeout=5, raise_on_failure=False)["status"] == "cancelled"
    with pytest.raises(ClientError) as info:
        client.cancel(job["id"])
    assert (info.value.status, info.value.code) == (409, "invalid_state")


def test_wait_times_out_on_a_job_nobody_runs(client: Client) -> None:
    job = client.enqueue("echo")
    with pytest.raises(TimeoutError, match="still queued"):
        client.wait(job["id"], timeout=0.5)


def test_unknown_and_malformed_ids_are_404(client: Client) -> None:
    for job_id in (uuid.uuid4(), "not-a-uuid", "../workers"):
        with pytest.raises(ClientError) as info:
            client.get(job_id)
        assert (info.value.status, info.value.code) == (404, "not_found")


def test_validation_errors_carry_details(client: Client) -> None:
    with pytest.raises(ClientError) as info:
        client.enqueue("echo", priority=12)
    assert (info.value.status, info.value.code) == (422, "validation_failed")
    assert any(d["field"] == "priority" for d in info.value.details)


def test_dlq_and_retry(client: Client, store: Store, dispatcher: Dispatcher) -> None:
    dead_id = make_dead(store, dispatcher)
    dead = client.dlq()
    assert [entry["job"]["id"] for entry in dead["jobs"]] == [dead_id]
    assert dead["jobs"][0]["final_error"] == "simulated failure"
    assert client.dlq(queue="other")["jobs"] == []
    with pytest.raises(JobFailed) as failed:
        client.wait(dead_id, timeout=1)
    assert (failed.value.error, failed.value.attempts) == ("simulated failure", 1)
    assert client.wait(dead_id, timeout=1, raise_on_failure=False)["status"] == "dead"
    assert client.retry(dead_id)["status"] == "queued"
    assert client.dlq()["jobs"] == []
    with pytest.raises(ClientError) as info:
        client.retry(dead_id)
    assert info.value.status == 409


def test_workers_and_queues(client: Client, store: Store) -> None:
    client.enqueue("echo", queue="reports")
    store.upsert_worker(WORKER, "host-a", 4242, ["reports"], 3)
    workers = client.workers()["workers"]
    assert [(w["id"], w["pid"], w["concurrency"]) for w in workers] == [(WORKER, 4242, 3)]
    queues = {q["name"]: q for q in client.queues()["queues"]}
    assert queues["reports"]["counts"]["queued"] == 1
    assert queues["reports"]["paused"] is False
    assert client.pause_queue("reports")["paused"] is True
    assert {q["name"]: q for q in client.queues()["queues"]}["reports"]["paused"] is True
    assert client.resume_queue("reports")["paused"] is False
    with pytest.raises(ClientError) as refused:
        client.pause_queue("not a queue")
    assert (refused.value.status, refused.value.code) == (400, "invalid_parameter")


def test_flow_limits(client: Client) -> None:
    created = client.set_limit("type:mail", concurrency=2, rate=10, period_s=1.5, per_key=True)
    assert (created["concurrency"], created["rate"], created["per_key"]) == (
        2, {"limit": 10, "period_s": 1.5}, True)
    job = client.enqueue("mail", limit_key="tenant-1")
    assert job["limit_key"] == "tenant-1"
    (listed,) = client.limits()["limits"]
    assert (listed["scope"], listed["held"]) == ("type:mail", 1)
    assert client.delete_limit("type:mail")["released"] == 1
    with pytest.raises(ClientError) as refused:
        client.set_limit("type:mail")
    assert (refused.value.status, refused.value.code) == (422, "validation_failed")


def test_token_is_required_when_configured(settings: Settings, tmp_path: Path) -> None:
    for url in start_api(settings, tmp_path / "logs", TASKLINE_API_TOKENS="s3cret"):
        with Client(url) as anonymous, pytest.raises(ClientError) as info:
            anonymous.queues()
        assert (info.value.status, info.value.code) == (401, "unauthorized")
        with Client(url, token="s3cret") as authorised:
            assert authorised.enqueue("echo")["status"] == "queued"


def test_scopes_whoami_and_the_audit_trail(settings: Settings, tmp_path: Path) -> None:
    tokens = "ops:o-secret:jobs:operate+jobs:write,reader:r-secret:jobs:read"
    for url in start_api(settings, tmp_path / "logs", TASKLINE_API_TOKENS=tokens):
        with Client(url, token="o-secret") as ops, Client(url, token="r-secret") as reader:
            assert ops.whoami() == {"name": "ops", "kind": "token", "authentication": True,
                                    "scopes": ["jobs:operate", "jobs:write"]}
            job = ops.enqueue("echo")
            ops.cancel(job["id"])
            [record] = ops.audit(actor="ops")["records"]
            assert (record["action"], record["target"]) == ("job.cancel", job["id"])
            assert reader.get(job["id"])["status"] == "cancelled"
            with pytest.raises(ClientError) as info:
                reader.audit()
            assert (info.value.status, info.value.code) == (403, "forbidden")
            assert info.value.details["scope"] == "jobs:operate"
