"""Declared job types against real PostgreSQL and Redis: workers record their types with each
payload's JSON Schema, the API checks payloads against them (any live version fits), lists them,
ages out the declarations of workers unseen for TASKLINE_TYPE_TTL_S and, under
TASKLINE_UNKNOWN_TYPES=reject, refuses undeclared types; nothing is written on a refusal."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from flask.testing import FlaskClient
from prometheus_client import REGISTRY
from sqlalchemy import create_engine, text

import taskline
from taskline.dispatch.dispatcher import Dispatcher
from taskline.handlers.payloads import PayloadModel
from taskline.settings import Settings
from taskline.store.store import Store, sqlalchemy_url
from taskline_producer.app import close_app, create_app
from tests.helpers import enqueue, service, service_env, wait_for
from tests.integration.typed_payloads import ReceiptV1, ReceiptV2

pytestmark = pytest.mark.slow

@taskline.handler("lib.receipt", payload=ReceiptV2, queue="receipts", priority="high",
                  max_retries=5, timeout_s=30)
def lib_receipt(payload: ReceiptV2, ctx: taskline.JobContext) -> None:
    """Declared in this module: the library's `.enqueue` / `.aenqueue` tests use it."""


V1 = "tests.integration.typed_handlers_v1"
V2 = "tests.integration.typed_handlers_v2"


@contextmanager
def api(settings: Settings) -> Iterator[FlaskClient]:
    """A fresh app: its cache of declared schemas starts empty, so it reads them now."""
    app = create_app(settings)
    try:
        yield app.test_client()
    finally:
        close_app(app)


@contextmanager
def workers(settings: Settings, tmp_path: Path, *modules: str) -> Iterator[list[str]]:
    """One `taskline worker --handlers M` per module; their ids once each has declared."""
    with ExitStack() as stack:
        procs = [stack.enter_context(service(
            ["worker", "--queues", "receipts,default", "--concurrency", "2",
             "--handlers", module], service_env(settings), tmp_path / "logs"))
            for module in modules]
        store = stack.enter_context(_store(settings))
        wait_for(lambda: len(_worker_ids(store)) == len(modules) or any(
            p.poll() is not None for p in procs), timeout=30, message="workers declared")
        assert all(p.poll() is None for p in procs), f"a worker exited: {tmp_path / 'logs'}"
        yield sorted(_worker_ids(store))


@contextmanager
def _store(settings: Settings) -> Iterator[Store]:
    store = Store.connect(settings.database_url, pool_size=2)
    try:
        yield store
    finally:
        store.dispose()


def _worker_ids(store: Store) -> set[str]:
    return {w for row in store.list_declared_types(86_400) for w in row.workers}


def job_count(store: Store) -> int:
    with store.transaction() as conn:
        return conn.execute(text("SELECT count(*) FROM taskline.jobs")).scalar_one()


def post(client: FlaskClient, body: dict[str, Any]) -> Any:
    return client.post("/api/v1/jobs", data=json.dumps(body), content_type="application/json")


def finished(store: Store, job_id: str) -> Any:
    return wait_for(lambda: (j := store.get_job(job_id)) is not None
                    and j.status.value in ("succeeded", "dead") and j, timeout=20,
                    message=f"job {job_id} finished")


def test_two_releases_of_a_type_are_both_accepted_and_each_runs_its_own(
        settings: Settings, store: Store, tmp_path: Path) -> None:
    with workers(settings, tmp_path, V1, V2) as ids, api(settings) as client:
        listed = client.get("/api/v1/types").get_json()["types"]
        receipt = next(t for t in listed if t["type"] == "typed.receipt")
        assert receipt["workers"] == ids
        assert receipt["queue"] == "receipts"
        assert len(receipt["schemas"]) == 2
        assert {tuple(v["schema"]["required"]) for v in receipt["schemas"]} == {
            ("order",), ("order_id",)}
        ping = next(t for t in listed if t["type"] == "typed.ping")
        assert ping["schema"]["required"] == ["host"] and len(ping["workers"]) == 1
        echo = next(t for t in listed if t["type"] == "echo")
        assert echo["schema"] is None and echo["workers"] == ids  # built-ins: any payload

        old = post(client, {"type": "typed.receipt", "payload": {"order": 7}, "queue": "receipts"})
        new = post(client, {"type": "typed.receipt", "payload": {"order_id": "A-7"},
                            "queue": "receipts"})
        assert old.status_code == new.status_code == 201
        neither = post(client, {"type": "typed.receipt", "payload": {"order": "seven"},
                                "queue": "receipts"})
        assert neither.status_code == 422
        assert neither.get_json()["error"]["code"] == "validation_failed"
        # The errors of the version it comes closest to (here a tie: either one's).
        assert neither.get_json()["error"]["details"][0]["field"] in ("payload.order",
                                                                       "payload.order_id")
        # Either release's worker may take either job: one fits, the other dead-letters it.
        results = [finished(store, r.get_json()["id"]) for r in (old, new)]
        for job in results:
            assert job.status.value == "dead" or job.result["class"] in ("ReceiptV1",
                                                                         "ReceiptV2")
        assert job_count(store) == 2


def test_a_worker_runs_a_declared_job_with_the_instance_and_refuses_a_misfit(
        settings: Settings, store: Store, dispatcher: Dispatcher, tmp_path: Path) -> None:
    with workers(settings, tmp_path, V2), api(settings) as client:
        made = post(client, {"type": "typed.receipt", "payload": {"order_id": "B-1"},
                             "queue": "receipts"})
        assert made.status_code == 201
        done = finished(store, made.get_json()["id"])
        assert done.result == {"class": "ReceiptV2", "order_id": "B-1", "copies": 1}
        ping = post(client, {"type": "typed.ping", "payload": {"host": "db1"}})
        assert finished(store, ping.get_json()["id"]).result == "db1"
        # Written past the API (as a job enqueued before the schema changed was): the worker
        # dead-letters it at once, naming the field, without retries.
        misfit = enqueue(store, dispatcher, "typed.receipt", {"order_id": 5}, queue="receipts",
                         max_retries=3)
        dead = finished(store, str(misfit.id))
        assert dead.status.value == "dead" and dead.attempts == 1
        assert "InvalidPayload" in dead.last_error and "payload.order_id" in dead.last_error
    logs = "".join(p.read_text() for p in (tmp_path / "logs").iterdir())
    assert "worker serves" in logs and "typed.receipt" in logs


def declare(store: Store, worker_id: str, types: list[dict[str, Any]]) -> None:
    """What a worker does at start, for a worker that never runs (backdated as needed)."""
    store.upsert_worker(worker_id, "host", 1, ["receipts"], 1)
    store.declare_types(worker_id, types, 86_400)


def receipt(model: type, worker_queue: str = "receipts") -> dict[str, Any]:
    return {"type": "typed.receipt", "queue": worker_queue, "schema": PayloadModel(model).schema}


def backdate(store: Store, worker_id: str, seconds: int) -> None:
    with store.transaction() as conn:
        conn.execute(text("UPDATE taskline.workers SET last_heartbeat = now() - "
                          "make_interval(secs => :s), stopped_at = now() WHERE id = :id"),
                     {"s": seconds, "id": worker_id})


def test_a_stopped_workers_declaration_ages_out_after_the_ttl(settings: Settings,
                                                              store: Store) -> None:
    settings = settings.replace(type_ttl_s=600)
    declare(store, "w-old", [receipt(ReceiptV1)])
    declare(store, "w-new", [receipt(ReceiptV2)])
    backdate(store, "w-old", 300)  # stopped, but within the TTL: still counts
    with api(settings) as client:
        assert post(client, {"type": "typed.receipt", "payload": {"order": 1}}).status_code == 201
        [listed] = client.get("/api/v1/types").get_json()["types"]
        assert listed["workers"] == ["w-new", "w-old"] and len(listed["schemas"]) == 2
    backdate(store, "w-old", 601)
    with api(settings) as client:
        refused = post(client, {"type": "typed.receipt", "payload": {"order": 1}})
        assert refused.status_code == 422
        assert refused.get_json()["error"]["details"][0]["field"] == "payload.order_id"
        [listed] = client.get("/api/v1/types").get_json()["types"]
        assert listed["workers"] == ["w-new"] and len(listed["schemas"]) == 1
    backdate(store, "w-new", 601)
    with api(settings) as client:  # no live declaration left: undeclared, accepted again
        assert post(client, {"type": "typed.receipt", "payload": {"x": 1}}).status_code == 201
        assert client.get("/api/v1/types").get_json() == {"types": []}
    assert job_count(store) == 2
    # The next worker to start forgets declarations older than the TTL.
    with store.transaction() as conn:
        conn.execute(text("UPDATE taskline.declared_types SET declared_at = now() - "
                          "interval '1 hour'"))
    store.declare_types("w-next", [], 600)
    with store.transaction() as conn:
        left = conn.execute(text("SELECT count(*) FROM taskline.declared_types")).scalar_one()
    assert left == 0


def test_reject_mode_refuses_undeclared_types_and_keeps_declared_ones(
        settings: Settings, store: Store) -> None:
    declare(store, "w-1", [receipt(ReceiptV2),
                           {"type": "echo", "queue": "default", "schema": None}])
    undeclared, misfit = refused("other", "undeclared"), refused("typed.receipt", "schema")
    with api(settings.replace(unknown_types="reject")) as client:
        misspelt = post(client, {"type": "typed.reciept", "payload": {"order_id": "1"}})
        assert misspelt.status_code == 422
        [error] = misspelt.get_json()["error"]["details"]
        assert error["field"] == "type" and "typed.reciept" in error["message"]
        assert post(client, {"type": "echo", "payload": {"any": ["thing"]}}).status_code == 201
        assert post(client, {"type": "typed.receipt",
                             "payload": {"order_id": "1"}}).status_code == 201
        batch = client.post("/api/v1/jobs/batch", content_type="application/json",
                            data=json.dumps({"jobs": [
                                {"type": "echo"}, {"type": "nope"},
                                {"type": "typed.receipt", "payload": {"copies": "x"}}]}))
        assert batch.status_code == 422
        fields = [d["field"] for d in batch.get_json()["error"]["details"]]
        assert "jobs[1].type" in fields and "jobs[2].payload.order_id" in fields
        assert "jobs[2].payload.copies" in fields
    assert job_count(store) == 2
    assert refused("other", "undeclared") == undeclared + 2
    assert refused("typed.receipt", "schema") == misfit + 1


def refused(label: str, reason: str) -> float:
    """taskline_payload_refused_total{type=label, reason} in this process so far."""
    return REGISTRY.get_sample_value("taskline_payload_refused_total",
                                     {"type": label, "reason": reason}) or 0.0


def test_accept_mode_takes_undeclared_types_and_checks_declared_ones(
        settings: Settings, store: Store) -> None:
    declare(store, "w-1", [receipt(ReceiptV2)])
    with api(settings) as client:
        assert post(client, {"type": "anything.else", "payload": {"x": 1}}).status_code == 201
        for payload, field in (({"order_id": 5}, "payload.order_id"),
                               ({}, "payload.order_id"),
                               ({"order_id": "1", "copies": 1.5}, "payload.copies"),
                               ([1, 2], "payload")):
            answer = post(client, {"type": "typed.receipt", "payload": payload})
            assert answer.status_code == 422, payload
            assert answer.get_json()["error"]["details"][0]["field"] == field, payload
    assert job_count(store) == 1


def test_types_require_the_read_scope(settings: Settings) -> None:
    with api(settings.replace(api_tokens=("writer:w-secret:jobs:write",))) as client:
        answer = client.get("/api/v1/types", headers={"Authorization": "Bearer w-secret"})
        assert answer.status_code == 403


def test_a_declared_handler_enqueues_with_its_defaults_and_validates_first(
        settings: Settings, store: Store) -> None:
    engine = create_engine(sqlalchemy_url(settings.database_url))
    try:
        with engine.begin() as conn:
            typed = lib_receipt.enqueue(conn, ReceiptV2("A-1"))
            as_json = lib_receipt.enqueue(conn, {"order_id": "A-2", "copies": 2},  # type: ignore[arg-type]
                                          queue="urgent", priority=9, delay_s=60)
        with pytest.raises(taskline.InvalidJob) as caught, engine.begin() as conn:
            lib_receipt.enqueue(conn, {"order_id": 3, "copies": "x"})  # type: ignore[arg-type]
        assert [e["field"] for e in caught.value.errors] == ["payload.order_id",
                                                             "payload.copies"]
    finally:
        engine.dispose()
    first, second = store.get_job(typed), store.get_job(as_json)
    assert (first.queue, first.priority, first.max_retries, first.timeout_s) == (
        "receipts", 7, 5, 30.0)
    assert first.payload == {"order_id": "A-1", "copies": 1}  # the defaults written out
    assert (second.queue, second.priority, second.status.value) == ("urgent", 9, "scheduled")
    assert job_count(store) == 2


def test_a_declared_handler_enqueues_on_an_async_connection(settings: Settings,
                                                           store: Store) -> None:
    async def body() -> Any:
        async with await psycopg.AsyncConnection.connect(settings.database_url) as conn:
            made = await lib_receipt.aenqueue(conn, ReceiptV2("B-1", copies=3),
                                              idempotency_key="b-1")
            again = await lib_receipt.aenqueue(conn, ReceiptV2("B-1", copies=3),
                                               idempotency_key="b-1")
            await conn.commit()
            with pytest.raises(taskline.InvalidJob):
                await lib_receipt.aenqueue(conn, {"copies": 1})  # type: ignore[arg-type]
            await conn.rollback()
            return made, again
    made, again = asyncio.run(body())
    assert made == again
    job = store.get_job(made)
    assert (job.queue, job.payload) == ("receipts", {"order_id": "B-1", "copies": 3})
    assert job_count(store) == 1


def test_workflow_steps_of_a_declared_type_are_checked_before_anything_is_written(
        settings: Settings, store: Store) -> None:
    declare(store, "w-1", [receipt(ReceiptV2)])
    steps = [{"id": "a", "job": {"type": "echo"}},
             {"id": "b", "job": {"type": "typed.receipt", "payload": {"order_id": 5}},
              "after": ["a"]}]
    with api(settings) as client:
        refused = client.post("/api/v1/workflows", content_type="application/json",
                              data=json.dumps({"name": "w", "steps": steps}))
        assert refused.status_code == 422
        assert [d["field"] for d in refused.get_json()["error"]["details"]] == [
            "steps[1] (b).job.payload.order_id"]
        steps[1]["job"]["payload"] = {"order_id": "5"}
        made = client.post("/api/v1/workflows", content_type="application/json",
                           data=json.dumps({"name": "w", "steps": steps}))
        assert made.status_code == 201, made.get_json()
    with store.transaction() as conn:
        assert conn.execute(text("SELECT count(*) FROM taskline.workflows")).scalar_one() == 1
    assert job_count(store) == 2


def test_a_schedules_job_of_a_declared_type_is_checked_when_it_is_set(
        settings: Settings, store: Store) -> None:
    declare(store, "w-1", [receipt(ReceiptV2)])
    job = {"type": "typed.receipt", "payload": {"order": 1}, "queue": "receipts"}
    with api(settings) as client:
        refused = client.put("/api/v1/schedules/nightly", content_type="application/json",
                             data=json.dumps({"cron": "0 3 * * *", "job": job}))
        assert refused.status_code == 422
        assert refused.get_json()["error"]["details"][0]["field"] == "job.payload.order_id"
        assert client.get("/api/v1/schedules/nightly").status_code == 404
        job["payload"] = {"order_id": "1"}
        made = client.put("/api/v1/schedules/nightly", content_type="application/json",
                          data=json.dumps({"cron": "0 3 * * *", "job": job}))
        assert made.status_code == 201, made.get_json()
