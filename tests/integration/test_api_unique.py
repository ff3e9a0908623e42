"""Unique jobs and debounce through the HTTP API (single, batch, the event history, auth
scopes, bad input) on real PostgreSQL and Redis."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from prometheus_client import REGISTRY
from sqlalchemy import text

from taskline.dispatch.dispatcher import Dispatcher
from taskline.settings import Settings
from taskline.store.store import Store
from taskline_producer.app import close_app, create_app


def _post(client: FlaskClient, body: dict[str, Any], **headers: str) -> Any:
    return client.post("/api/v1/jobs", json=body, headers=headers)


def _count(store: Store) -> int:
    with store.transaction() as conn:
        return int(conn.execute(text("SELECT count(*) FROM taskline.jobs")).scalar_one())


def _folded(outcome: str) -> float:
    return REGISTRY.get_sample_value("taskline_enqueue_folded_total",
                                     {"type": "other", "queue": "default",
                                      "outcome": outcome}) or 0.0


def test_duplicate_answers_200_with_the_first_job(client: FlaskClient, store: Store,
                                                  dispatcher: Dispatcher) -> None:
    before = _folded("duplicate")
    first = _post(client, {"type": "t", "payload": {"a": 1}, "unique": {"key": "k"}})
    again = _post(client, {"type": "t", "payload": {"a": 2}, "unique": {"key": "k"}})
    assert first.status_code == 201 and "duplicate" not in first.json
    assert again.status_code == 200 and again.json["duplicate"] is True
    assert again.json["id"] == first.json["id"] and again.json["payload"] == {"a": 1}
    assert again.headers["Location"] == f"/api/v1/jobs/{first.json['id']}"
    assert _count(store) == 1
    assert _folded("duplicate") == before + 1
    shown = client.get(f"/api/v1/jobs/{first.json['id']}").json
    assert shown["unique_key"] == "k" and [e["event"] for e in shown["events"]] == ["enqueued"]


def test_idempotency_key_is_checked_first(client: FlaskClient, store: Store) -> None:
    body = {"type": "t", "unique": {"key": "u"}}
    first = _post(client, body, **{"Idempotency-Key": "i-1"})
    replay = _post(client, body, **{"Idempotency-Key": "i-1"})
    assert replay.status_code == 200 and replay.json["id"] == first.json["id"]
    assert "duplicate" not in replay.json  # a replay, not a unique duplicate
    dup = _post(client, body, **{"Idempotency-Key": "i-2"})
    assert dup.status_code == 200 and dup.json["duplicate"] and dup.json["id"] == first.json["id"]
    # The duplicate recorded no key: i-2 is free for another request, which is a duplicate too.
    other = _post(client, {"type": "t", "payload": 5, "unique": {"key": "u"}},
                  **{"Idempotency-Key": "i-2"})
    assert other.status_code == 200 and other.json["id"] == first.json["id"]
    assert _count(store) == 1


def test_replace_until_started_then_409(client: FlaskClient, store: Store) -> None:
    unique = {"key": "r", "on_conflict": "replace"}
    first = _post(client, {"type": "t", "payload": 1, "delay_s": 60, "unique": unique})
    replaced = _post(client, {"type": "t", "payload": 2, "priority": 9, "delay_s": 30,
                              "unique": unique})
    assert replaced.status_code == 200 and replaced.json["replaced"] is True
    assert (replaced.json["payload"], replaced.json["priority"]) == (2, 9)
    with store.transaction() as conn:
        conn.execute(text("UPDATE taskline.jobs SET status = 'running', attempts = 1"))
    refused = _post(client, {"type": "t", "payload": 3, "unique": unique})
    assert refused.status_code == 409
    assert refused.json["error"]["code"] == "already_started"
    assert refused.json["error"]["details"] == {"id": first.json["id"], "status": "running"}
    assert store.get_job(first.json["id"]).payload == 2


def test_debounce_joins_and_shows_in_the_job(client: FlaskClient, store: Store,
                                             dispatcher: Dispatcher) -> None:
    before = _folded("joined")
    answers = [_post(client, {"type": "t", "payload": n,
                              "debounce": {"key": "d", "delay_s": 20}}) for n in range(3)]
    assert [a.status_code for a in answers] == [201, 200, 200]
    assert answers[1].json["debounced"] is True
    job_id = answers[0].json["id"]
    assert {a.json["id"] for a in answers} == {job_id}
    shown = client.get(f"/api/v1/jobs/{job_id}").json
    assert shown["status"] == "scheduled" and shown["debounce"] == {"key": "d", "joined": 3}
    assert [e["event"] for e in shown["events"]] == ["scheduled", "joined", "joined"]
    assert shown["events"][2]["detail"] == {"joined": 3, "status": "scheduled"}
    assert _folded("joined") == before + 2
    assert store.get_job(job_id).coalesced == [0, 1, 2]


def test_batch_holds_unique_jobs_all_or_none(client: FlaskClient, store: Store) -> None:
    answer = client.post("/api/v1/jobs/batch", json={"jobs": [
        {"type": "t", "unique": {"key": "b"}}, {"type": "t", "unique": {"key": "b"}},
        {"type": "t"}, {"type": "t", "debounce": {"key": "x", "delay_s": 5}},
        {"type": "t", "debounce": {"key": "x", "delay_s": 5}}]})
    assert answer.status_code == 201, answer.json
    jobs = answer.json["jobs"]
    assert [j["created"] for j in jobs] == [True, False, True, True, False]
    assert jobs[1]["duplicate"] and jobs[4]["debounced"]
    assert jobs[1]["job"]["id"] == jobs[0]["job"]["id"]
    assert _count(store) == 3
    refused = client.post("/api/v1/jobs/batch", json={"jobs": [
        {"type": "t", "unique": {"key": "c"}},
        {"type": "t", "unique": {"key": "r0", "on_conflict": "replace"}}]})
    assert refused.status_code == 201
    with store.transaction() as conn:
        conn.execute(text("UPDATE taskline.jobs SET status = 'running', attempts = 1 "
                          "WHERE unique_key = 'r0'"))
    conflict = client.post("/api/v1/jobs/batch", json={"jobs": [
        {"type": "t", "unique": {"key": "new"}},
        {"type": "t", "unique": {"key": "r0", "on_conflict": "replace"}}]})
    assert conflict.status_code == 409
    assert _count(store) == 5  # the batch's first job was rolled back with it


@pytest.mark.parametrize("body, field", [
    ({"type": "t", "unique": {"states": ["queued", "sleeping"]}}, "unique.states[1]"),
    ({"type": "t", "unique": {"period_s": -5}}, "unique.period_s"),
    ({"type": "t", "unique": "k"}, "unique"),
    ({"type": "t", "unique": {"key": "k", "extra": 1}}, "unique.extra"),
    ({"type": "t", "debounce": {"key": "k", "delay_s": 1}, "unique": {}}, "debounce"),
    ({"type": "t", "debounce": {"key": "k", "delay_s": 1}, "idempotency_key": "x"}, "debounce"),
    ({"type": "t", "debounce": {"key": "k", "delay_s": 0}}, "debounce.delay_s"),
    ({"type": "t", "debounce": {"key": "k", "delay_s": 1}, "delay_s": 3}, "debounce"),
])
def test_bad_input_is_422_naming_the_field(client: FlaskClient, store: Store,
                                           body: dict, field: str) -> None:
    answer = _post(client, body)
    assert answer.status_code == 422
    assert field in [d["field"] for d in answer.json["error"]["details"]]
    assert _count(store) == 0


def test_debounce_with_idempotency_header_is_422(client: FlaskClient, store: Store) -> None:
    answer = _post(client, {"type": "t", "debounce": {"key": "k", "delay_s": 1}},
                   **{"Idempotency-Key": "h"})
    assert answer.status_code == 422
    assert answer.json["error"]["details"][0]["field"] == "debounce"


@pytest.mark.parametrize("field", ["unique", "debounce"])
def test_workflow_step_with_either_is_422(client: FlaskClient, store: Store,
                                          field: str) -> None:
    value = {"key": "k", "delay_s": 1} if field == "debounce" else {}
    answer = client.post("/api/v1/workflows", json={"name": "w", "steps": [
        {"id": "a", "job": {"type": "t", field: value}}]})
    assert answer.status_code == 422
    assert answer.json["error"]["details"][0]["field"] == f"steps[0] (a).job.{field}"
    assert _count(store) == 0


@pytest.fixture
def scoped_app(settings: Settings) -> Iterator[Flask]:
    made = create_app(settings.replace(api_tokens=("alice:a-secret", "bob:b-secret")))
    yield made
    close_app(made)


def test_unique_keys_are_scoped_per_principal(scoped_app: Flask, store: Store) -> None:
    client = scoped_app.test_client()
    body = {"type": "t", "unique": {"key": "same"}}
    alice = _post(client, body, Authorization="Bearer a-secret")
    bob = _post(client, body, Authorization="Bearer b-secret")
    alice_again = _post(client, body, Authorization="Bearer a-secret")
    assert alice.status_code == bob.status_code == 201
    assert alice_again.status_code == 200 and alice_again.json["id"] == alice.json["id"]
    assert alice_again.json["unique_key"] == "same"
    assert _count(store) == 2


@pytest.mark.parametrize("unique", [{"states": [{"a": 1}]}, {"states": [["queued"]]},
                                    {"on_conflict": {"x": 1}}, {"key": 5},
                                    {"period_s": True}, {"states": "queued"}])
def test_odd_values_are_422_not_500(client: FlaskClient, store: Store, unique: dict) -> None:
    answer = _post(client, {"type": "t", "unique": unique})
    assert answer.status_code == 422, answer.json
    assert _count(store) == 0


def test_debounce_groups_are_scoped_per_principal(scoped_app: Flask, store: Store) -> None:
    client = scoped_app.test_client()
    body = {"type": "t", "payload": 1, "debounce": {"key": "digest", "delay_s": 30}}
    alice = [_post(client, body, Authorization="Bearer a-secret") for _ in range(2)]
    bob = _post(client, body, Authorization="Bearer b-secret")
    assert [a.status_code for a in alice] == [201, 200] and bob.status_code == 201
    assert bob.json["id"] != alice[0].json["id"]
    assert alice[1].json["debounce"] == {"key": "digest", "joined": 2}
    assert bob.json["debounce"] == {"key": "digest", "joined": 1}
