"""Idempotency keys per principal with authentication on (taskline_producer.operations.replays).

Another principal's same key is another key: it neither replays, nor is refused, nor learns
the first job's id; a replay shows `result` and `last_error` only to a principal that may
read jobs; the library and a deployment without authentication share one scope.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import jwt
import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import text

import taskline
from taskline.settings import Settings
from taskline.store.store import Store
from taskline_producer.app import close_app, create_app

TOKENS = ("alice:a-secret:jobs:write", "bob:b-secret:jobs:write",
          "carol:c-secret:jobs:write+jobs:read")
SECRET = "an-hs256-secret-of-at-least-32-bytes!"
WORKFLOW = {"name": "w", "steps": [{"id": "a", "job": {"type": "echo"}}]}


@pytest.fixture
def app(settings: Settings) -> Iterator[Flask]:
    made = create_app(settings.replace(api_tokens=TOKENS, jwt_key=SECRET))
    yield made
    close_app(made)


def as_(secret: str, key: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {secret}"}
    return headers | ({"Idempotency-Key": key} if key else {})


def post(client: FlaskClient, secret: str, body: dict[str, Any], key: str = "k1") -> Any:
    return client.post("/api/v1/jobs", json=body, headers=as_(secret, key))


def test_another_principals_same_key_is_another_key(app: Flask, store: Store):
    client = app.test_client()
    first = post(client, "a-secret", {"type": "echo", "payload": {"n": 1}})
    other = post(client, "b-secret", {"type": "echo", "payload": {"n": 2}})
    assert (first.status_code, other.status_code) == (201, 201)
    assert other.get_json()["id"] != first.get_json()["id"]
    assert first.get_json()["id"] not in other.get_data(as_text=True)
    replay = post(client, "a-secret", {"type": "echo", "payload": {"n": 1}})
    assert (replay.status_code, replay.get_json()["id"]) == (200, first.get_json()["id"])
    refused = post(client, "a-secret", {"type": "echo", "payload": {"n": 3}})
    assert refused.status_code == 422 and "'k1'" in refused.get_json()["error"]["message"]
    # Each answer shows the key as sent; the stored one carries its principal.
    assert {first.get_json()["idempotency_key"], other.get_json()["idempotency_key"]} == {"k1"}
    with store.transaction() as conn:
        stored = conn.execute(text("SELECT idempotency_key FROM taskline.jobs ORDER BY 1")
                              ).scalars().all()
    assert stored == ["token:alice\x1fk1", "token:bob\x1fk1"]


def test_a_batch_and_a_workflow_scope_their_keys_too(app: Flask):
    client = app.test_client()
    jobs = {"jobs": [{"type": "echo", "idempotency_key": "b1"}]}
    mine = client.post("/api/v1/jobs/batch", json=jobs, headers=as_("a-secret"))
    theirs = client.post("/api/v1/jobs/batch", json=jobs, headers=as_("b-secret"))
    assert mine.get_json()["created"] == theirs.get_json()["created"] == 1
    again = client.post("/api/v1/jobs/batch", json=jobs, headers=as_("a-secret"))
    assert again.get_json()["replayed"] == 1
    assert again.get_json()["jobs"][0]["job"]["id"] == mine.get_json()["jobs"][0]["job"]["id"]
    w1 = client.post("/api/v1/workflows", json=WORKFLOW, headers=as_("a-secret", "w"))
    w2 = client.post("/api/v1/workflows", json=WORKFLOW, headers=as_("b-secret", "w"))
    assert (w1.status_code, w2.status_code) == (201, 201)
    assert w1.get_json()["id"] != w2.get_json()["id"]
    w3 = client.post("/api/v1/workflows", json=WORKFLOW, headers=as_("a-secret", "w"))
    assert (w3.status_code, w3.get_json()["id"]) == (200, w1.get_json()["id"])


def test_a_replay_shows_result_and_error_only_to_a_reader(app: Flask, store: Store):
    client = app.test_client()
    body = {"type": "echo", "payload": {"secret": 1}}
    writer = post(client, "a-secret", body).get_json()["id"]
    reader = post(client, "c-secret", body).get_json()["id"]
    with store.transaction() as conn:
        conn.execute(text("UPDATE taskline.jobs SET status = 'dead', result = '{\"r\": 1}', "
                          "last_error = 'boom' WHERE id = ANY(:ids)"), {"ids": [writer, reader]})
    hidden = post(client, "a-secret", body).get_json()
    shown = post(client, "c-secret", body).get_json()
    assert (hidden["id"], hidden["result"], hidden["last_error"]) == (writer, None, None)
    assert (shown["id"], shown["result"], shown["last_error"]) == (reader, {"r": 1}, "boom")


def test_a_jwt_subject_is_scoped_by_its_issuer(app: Flask):
    client = app.test_client()

    def token(issuer: str) -> str:
        now = int(time.time())
        return jwt.encode({"sub": "svc", "iss": issuer, "scope": "jobs:write", "exp": now + 60,
                           "iat": now}, SECRET, algorithm="HS256")

    one = post(client, token("https://a.example"), {"type": "echo", "payload": 1}, "j")
    two = post(client, token("https://b.example"), {"type": "echo", "payload": 2}, "j")
    same_name_token = post(client, "a-secret", {"type": "echo", "payload": 3}, "j")
    assert [r.status_code for r in (one, two, same_name_token)] == [201, 201, 201]


def test_without_auth_the_api_and_the_library_share_one_scope(settings: Settings,
                                                                store: Store):
    with store.transaction() as conn:
        job_id = taskline.enqueue(conn, "echo", {"n": 1}, idempotency_key="shared")
    app = create_app(settings)
    try:
        replay = app.test_client().post("/api/v1/jobs", json={"type": "echo", "payload": {"n": 1}},
                                        headers={"Idempotency-Key": "shared"})
    finally:
        close_app(app)
    assert (replay.status_code, replay.get_json()["id"]) == (200, str(job_id))
