"""POST /api/v1/jobs and /api/v1/jobs/batch against real PostgreSQL and Redis.

Every bad-input class gets a 4xx in the error shape and writes nothing; accepted jobs are
committed with their first event and only then pushed to Redis; idempotency keys replay or
refuse; a batch is one transaction.
"""

from __future__ import annotations

import io
import json
import logging
import threading
from typing import Any

import psycopg
import pytest
from flask import Flask
from flask.testing import FlaskClient
from prometheus_client import REGISTRY
from sqlalchemy import event

from taskline.dispatch.dispatcher import Dispatcher
from taskline.dispatch.keys import QueueKeys
from taskline.settings import Settings
from taskline.store.bulk import COPY_MIN_JOBS
from taskline.store.store import Store
from taskline_producer.app import close_app, create_app

JSON = "application/json"


def count_jobs(store: Store) -> int:
    with store.transaction() as conn:
        return conn.exec_driver_sql("SELECT count(*) FROM taskline.jobs").scalar_one()


def redis_ids(dispatcher: Dispatcher, queue: str = "default") -> list[str]:
    keys = QueueKeys(queue)
    ids: list[str] = []
    for key in keys.ready_by_urgency:
        ids += dispatcher.client.lrange(key, 0, -1)
    return ids + dispatcher.client.zrange(keys.scheduled, 0, -1)


def assert_error(response: Any, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.get_data(as_text=True)
    assert response.mimetype == JSON
    error = response.get_json()["error"]
    assert set(error) == {"code", "message", "details"}
    if code is not None:
        assert error["code"] == code
    return error


def test_enqueue_commits_then_pushes(client: FlaskClient, store: Store,
                                     dispatcher: Dispatcher) -> None:
    r = client.post("/api/v1/jobs", json={"type": "echo", "payload": {"n": 1}, "queue": "mail",
                                          "priority": "high", "max_retries": 2, "timeout_s": 9})
    assert r.status_code == 201
    job = r.get_json()
    assert r.headers["Location"] == f"/api/v1/jobs/{job['id']}"
    assert (job["status"], job["priority"], job["max_retries"], job["timeout_s"]) == (
        "queued", 7, 2, 9.0)
    stored = store.get_job(job["id"])
    assert stored is not None and stored.payload == {"n": 1}
    events, _ = store.get_history(stored.id)
    assert [e["event"] for e in events] == ["enqueued"]
    assert dispatcher.client.lrange(QueueKeys("mail").ready(7), 0, -1) == [job["id"]]


def test_defaults_apply(client: FlaskClient, settings: Settings) -> None:
    job = client.post("/api/v1/jobs", json={"type": "echo"}).get_json()
    assert job["payload"] == {} and job["queue"] == "default" and job["priority"] == 5
    assert job["max_retries"] == settings.default_max_retries
    assert job["timeout_s"] == settings.default_timeout_s


BAD_BODIES = [
    ("malformed", b'{"type": "echo"', JSON, 400, "invalid_json"),
    ("empty", b"", JSON, 400, "invalid_json"),
    ("not utf-8", b'{"type": "\xff"}', JSON, 400, "invalid_json"),
    ("text/plain", b'{"type": "echo"}', "text/plain", 415, "unsupported_media_type"),
    ("form", b"type=echo", "application/x-www-form-urlencoded", 415, "unsupported_media_type"),
    ("duplicate key", b'{"type": "echo", "type": "other"}', JSON, 400, "duplicate_key"),
    ("nested duplicate", b'{"type": "e", "payload": {"a": 1, "a": 1}}', JSON, 400,
     "duplicate_key"),
    ("NaN", b'{"type": "echo", "payload": {"x": NaN}}', JSON, 400, "non_finite_number"),
    ("Infinity", b'{"type": "echo", "timeout_s": Infinity}', JSON, 400, "non_finite_number"),
    ("overflow", b'{"type": "echo", "payload": 1e999}', JSON, 400, "non_finite_number"),
    ("NUL value", b'{"type": "echo", "payload": {"a": ["\\u0000"]}}', JSON, 400,
     "invalid_string"),
    ("NUL key", b'{"type": "echo", "payload": {"a\\u0000": 1}}', JSON, 400, "invalid_string"),
    ("NUL type", b'{"type": "ec\\u0000ho"}', JSON, 400, "invalid_string"),
    ("lone surrogate", b'{"type": "echo", "payload": "\\udfff"}', JSON, 400, "invalid_string"),
    ("surrogate key", b'{"type": "echo", "payload": {"\\ud800": 1}}', JSON, 400,
     "invalid_string"),
    ("10k deep", b'{"type": "echo", "payload": ' + b"[" * 10_000 + b"]" * 10_000 + b"}", JSON,
     400, "nesting_too_deep"),
    ("10k deep objects", b'{"a":' * 10_000 + b"1" + b"}" * 10_000, JSON, 400,
     "nesting_too_deep"),
    ("huge integer", b'{"type": "echo", "payload": ' + b"7" * 5000 + b"}", JSON, 400,
     "invalid_json"),
    ("array body", b'[{"type": "echo"}]', JSON, 422, "validation_failed"),
    ("unknown fields", b'{"type": "echo", "colour": "red", "size": 1}', JSON, 422,
     "validation_failed"),
    ("missing type", b'{"payload": {}}', JSON, 422, "validation_failed"),
    ("bool priority", b'{"type": "echo", "priority": true}', JSON, 422, "validation_failed"),
    ("bool retries", b'{"type": "echo", "max_retries": false}', JSON, 422, "validation_failed"),
    ("priority 10", b'{"type": "echo", "priority": 10}', JSON, 422, "validation_failed"),
    ("retries 101", b'{"type": "echo", "max_retries": 101}', JSON, 422, "validation_failed"),
    ("timeout 0", b'{"type": "echo", "timeout_s": 0}', JSON, 422, "validation_failed"),
    ("timeout > 1 day", b'{"type": "echo", "timeout_s": 86401}', JSON, 422,
     "validation_failed"),
    ("negative delay", b'{"type": "echo", "delay_s": -1}', JSON, 422, "validation_failed"),
    ("delay > 1 year", b'{"type": "echo", "delay_s": 31536001}', JSON, 422,
     "validation_failed"),
    ("naive run_at", b'{"type": "echo", "run_at": "2030-01-01T00:00:00"}', JSON, 422,
     "validation_failed"),
    ("delay and run_at", b'{"type": "e", "delay_s": 1, "run_at": "2030-01-01T00:00:00Z"}', JSON,
     422, "validation_failed"),
    ("bad queue", b'{"type": "echo", "queue": "no spaces"}', JSON, 422, "validation_failed"),
    ("long type", b'{"type": "' + b"t" * 201 + b'"}', JSON, 422, "validation_failed"),
    ("null payload", b'{"type": "echo", "payload": null}', JSON, 422, "validation_failed"),
    ("long key", b'{"type": "echo", "idempotency_key": "' + b"k" * 256 + b'"}', JSON, 400,
     "invalid_idempotency_key"),
    ("non-ASCII key", '{"type": "echo", "idempotency_key": "café-1"}'.encode(), JSON, 400,
     "invalid_idempotency_key"),
    ("key with a space", b'{"type": "echo", "idempotency_key": "a b"}', JSON, 400,
     "invalid_idempotency_key"),
]


@pytest.mark.parametrize(("raw", "content_type", "status", "code"),
                         [case[1:] for case in BAD_BODIES], ids=[c[0] for c in BAD_BODIES])
def test_bad_input_is_refused_and_writes_nothing(client: FlaskClient, store: Store,
                                                 dispatcher: Dispatcher, raw: bytes,
                                                 content_type: str, status: int,
                                                 code: str) -> None:
    before = count_jobs(store)
    r = client.post("/api/v1/jobs", data=raw, content_type=content_type)
    assert_error(r, status, code)
    assert count_jobs(store) == before
    assert redis_ids(dispatcher) == []


def test_unknown_fields_are_listed(client: FlaskClient) -> None:
    r = client.post("/api/v1/jobs", json={"type": "echo", "colour": 1, "size": 2})
    details = assert_error(r, 422, "validation_failed")["details"]
    assert {d["field"] for d in details} == {"colour", "size"}


def test_missing_content_type_is_415(client: FlaskClient, store: Store) -> None:
    r = client.post("/api/v1/jobs", data=b'{"type": "echo"}')
    assert_error(r, 415, "unsupported_media_type")
    assert count_jobs(store) == 0


def test_body_over_the_limit_is_413(settings: Settings, store: Store) -> None:
    app = create_app(settings.replace(max_payload_bytes=2048))
    try:
        big = json.dumps({"type": "echo", "payload": "x" * 4096})
        r = app.test_client().post("/api/v1/jobs", data=big, content_type=JSON)
        assert_error(r, 413, "payload_too_large")
        assert count_jobs(store) == 0
    finally:
        close_app(app)


def _chunked(client: FlaskClient, payload: bytes) -> Any:
    """A body without Content-Length, as gunicorn hands over a chunked request."""
    return client.post("/api/v1/jobs", input_stream=io.BytesIO(payload), content_type=JSON,
                       headers={"Transfer-Encoding": "chunked"},
                       environ_overrides={"wsgi.input_terminated": True})


def test_chunked_bodies_are_bounded_too(settings: Settings, store: Store) -> None:
    app = create_app(settings.replace(max_payload_bytes=2048))
    try:
        client = app.test_client()
        big = json.dumps({"type": "echo", "payload": "x" * 4096}).encode()
        assert_error(_chunked(client, big), 413, "payload_too_large")
        assert count_jobs(store) == 0
        small = _chunked(client, json.dumps({"type": "echo"}).encode())
        assert small.status_code == 201
    finally:
        close_app(app)


def _body_of(size: int) -> bytes:
    """An enqueue body of exactly `size` bytes."""
    empty = len(json.dumps({"type": "echo", "payload": ""}))
    return json.dumps({"type": "echo", "payload": "x" * (size - empty)}).encode()


def test_a_body_of_exactly_the_limit_is_accepted(settings: Settings, store: Store) -> None:
    """The limit is inclusive, framed by Content-Length or by chunks, as gunicorn hands them
    over (a terminated input stream); one byte more is a 413 in the error shape."""
    app = create_app(settings.replace(max_payload_bytes=2048))
    try:
        client = app.test_client()
        gunicorn = {"wsgi.input_terminated": True}
        at_limit, over = _body_of(2048), _body_of(2049)
        assert len(at_limit) == 2048
        r = client.post("/api/v1/jobs", data=at_limit, content_type=JSON,
                        environ_overrides=gunicorn)
        assert r.status_code == 201, r.get_data(as_text=True)
        assert _chunked(client, at_limit).status_code == 201
        for refused in (client.post("/api/v1/jobs", data=over, content_type=JSON,
                                    environ_overrides=gunicorn), _chunked(client, over)):
            error = assert_error(refused, 413, "payload_too_large")
            assert error["details"] == {"limit_bytes": 2048}
        with store.transaction() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM taskline.jobs").scalar_one() == 2
    finally:
        close_app(app)


def test_idempotent_replay_by_field_and_header(client: FlaskClient, store: Store,
                                               dispatcher: Dispatcher) -> None:
    body = {"type": "echo", "payload": {"a": 1}, "idempotency_key": "order-1"}
    first = client.post("/api/v1/jobs", json=body)
    assert first.status_code == 201
    again = client.post("/api/v1/jobs", json=body)
    assert again.status_code == 200 and again.get_json()["id"] == first.get_json()["id"]
    by_header = client.post("/api/v1/jobs", json={"payload": {"a": 1}, "type": "echo"},
                            headers={"Idempotency-Key": "order-1"})
    assert by_header.status_code == 200 and by_header.get_json()["id"] == first.get_json()["id"]
    assert count_jobs(store) == 1
    assert redis_ids(dispatcher) == [first.get_json()["id"]]


@pytest.mark.parametrize(("header", "body_key"), [
    ('"order-1"', "order-1"), ("order-1", "order-1"), ('"say-\\"hi\\""', 'say-"hi"')])
def test_a_key_names_one_job_whichever_way_it_travels(client: FlaskClient, store: Store,
                                                      header: str, body_key: str) -> None:
    """The header's sf-string is unquoted: `"order-1"` there is order-1 in the body."""
    by_body = client.post("/api/v1/jobs", json={"type": "echo", "idempotency_key": body_key})
    by_header = client.post("/api/v1/jobs", json={"type": "echo"},
                            headers={"Idempotency-Key": header})
    both = client.post("/api/v1/jobs", json={"type": "echo", "idempotency_key": body_key},
                       headers={"Idempotency-Key": header})
    assert by_body.status_code == 201 and (by_header.status_code, both.status_code) == (200, 200)
    assert by_body.get_json()["id"] == by_header.get_json()["id"] == both.get_json()["id"]
    assert by_header.get_json()["idempotency_key"] == body_key
    assert count_jobs(store) == 1


@pytest.mark.parametrize("header", ["caf\xc3\xa9-1", "caf\xe9-1", "a b", '"a b"', '"x', 'a"b'])
def test_an_invalid_key_header_is_a_400_that_writes_nothing(client: FlaskClient, store: Store,
                                                            header: str) -> None:
    """Raw bytes too: WSGI hands header bytes over as Latin-1, so UTF-8 é is two characters."""
    r = client.post("/api/v1/jobs", json={"type": "echo"}, headers={"Idempotency-Key": header})
    assert_error(r, 400, "invalid_idempotency_key")
    assert r.get_json()["error"]["details"][0]["field"] == "Idempotency-Key"
    assert count_jobs(store) == 0


def test_same_key_other_body_is_422(client: FlaskClient, store: Store) -> None:
    client.post("/api/v1/jobs", json={"type": "echo", "idempotency_key": "k"})
    r = client.post("/api/v1/jobs", json={"type": "echo", "payload": {"x": 1}},
                    headers={"Idempotency-Key": "k"})
    assert_error(r, 422, "idempotency_key_reused")
    assert count_jobs(store) == 1


def test_key_is_scoped_to_its_queue(client: FlaskClient, store: Store) -> None:
    a = client.post("/api/v1/jobs", json={"type": "echo", "idempotency_key": "k"})
    b = client.post("/api/v1/jobs", json={"type": "echo", "queue": "other",
                                          "idempotency_key": "k"})
    assert (a.status_code, b.status_code) == (201, 201)
    assert count_jobs(store) == 2


def test_header_and_field_keys_must_agree(client: FlaskClient, store: Store) -> None:
    r = client.post("/api/v1/jobs", json={"type": "echo", "idempotency_key": "a"},
                    headers={"Idempotency-Key": "b"})
    details = assert_error(r, 422, "validation_failed")["details"]
    assert details[0]["field"] == "idempotency_key"
    assert count_jobs(store) == 0


def test_concurrent_duplicates_insert_one_row(app: Flask, store: Store) -> None:
    barrier = threading.Barrier(8)
    results: list[tuple[int, str]] = []

    def post() -> None:
        client = app.test_client()
        barrier.wait()
        r = client.post("/api/v1/jobs", json={"type": "echo", "payload": {"p": 1}},
                        headers={"Idempotency-Key": "race"})
        results.append((r.status_code, r.get_json().get("id")))

    threads = [threading.Thread(target=post) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(status for status, _ in results) == [200] * 7 + [201]
    assert len({job_id for _, job_id in results}) == 1
    assert count_jobs(store) == 1


def _db_due_ms(store: Store, job_id: str) -> int:
    with store.transaction() as conn:
        return conn.exec_driver_sql(
            "SELECT (extract(epoch FROM next_run_at) * 1000)::bigint FROM taskline.jobs WHERE "
            "id = %s",
            (job_id,)).scalar_one()


def test_delayed_job_lands_in_the_scheduled_set_at_postgresql_due_time(
        client: FlaskClient, store: Store, dispatcher: Dispatcher) -> None:
    job = client.post("/api/v1/jobs", json={"type": "echo", "delay_s": 30.25}).get_json()
    assert job["status"] == "scheduled"
    score = dispatcher.client.zscore(QueueKeys("default").scheduled, job["id"])
    assert score == _db_due_ms(store, job["id"])
    with store.transaction() as conn:
        lag = conn.exec_driver_sql(
            "SELECT extract(epoch FROM next_run_at - created_at) FROM taskline.jobs WHERE id = %s",
            (job["id"],)).scalar_one()
    assert float(lag) == pytest.approx(30.25, abs=0.001)
    events, _ = store.get_history(job["id"])
    assert [e["event"] for e in events] == ["scheduled"]
    assert not any(dispatcher.client.llen(k) for k in QueueKeys("default").ready_by_urgency)


def test_run_at_in_the_future_is_scheduled_in_the_past_queued(
        client: FlaskClient, store: Store, dispatcher: Dispatcher) -> None:
    future = client.post("/api/v1/jobs", json={"type": "e", "run_at": "2999-01-01T00:00:00Z"})
    past = client.post("/api/v1/jobs", json={"type": "e", "run_at": "2001-01-01T00:00:00+02:00"})
    assert future.get_json()["status"] == "scheduled"
    assert future.get_json()["next_run_at"].startswith("2999-01-01T00:00:00")
    assert dispatcher.client.zscore(QueueKeys("default").scheduled, future.get_json()["id"]) == (
        _db_due_ms(store, future.get_json()["id"]))
    assert past.get_json()["status"] == "queued"
    assert past.get_json()["next_run_at"].startswith("2000-12-31T22:00:00")
    assert dispatcher.client.lrange(QueueKeys("default").ready(5), 0, -1) == [
        past.get_json()["id"]]


def test_redis_down_after_commit_still_accepts(settings: Settings, store: Store,
                                               unused_port: int,
                                               caplog: pytest.LogCaptureFixture) -> None:
    app = create_app(settings.replace(redis_url=f"redis://127.0.0.1:{unused_port}/0"))
    try:
        with caplog.at_level(logging.WARNING, logger="taskline_producer.operations.enqueuer"):
            r = app.test_client().post("/api/v1/jobs", json={"type": "echo"})
        assert r.status_code == 201
        assert store.get_job(r.get_json()["id"]).status == "queued"
        assert "reconciliation" in caplog.text
    finally:
        close_app(app)




# --- batch ----------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [26, 2 * COPY_MIN_JOBS], ids=["statement", "copy"])
def test_batch_inserts_all_and_pushes_them(client: FlaskClient, store: Store,
                                           dispatcher: Dispatcher, size: int) -> None:
    jobs = [{"type": "echo", "payload": {"i": i}, "priority": i % 10} for i in range(size - 1)]
    jobs.append({"type": "echo", "delay_s": 60})
    r = client.post("/api/v1/jobs/batch", json={"jobs": jobs})
    assert r.status_code == 201
    result = r.get_json()
    assert (result["created"], result["replayed"]) == (size, 0)
    assert [item["index"] for item in result["jobs"]] == list(range(size))
    assert all(item["created"] for item in result["jobs"])
    assert count_jobs(store) == size and count_jobs_without_one_event(store) == 0
    assert sorted(redis_ids(dispatcher)) == sorted(item["job"]["id"] for item in result["jobs"])
    assert result["jobs"][-1]["job"]["status"] == "scheduled"
    for item in (result["jobs"][0], result["jobs"][-1]):  # the answer is what a GET shows
        shown = client.get(f"/api/v1/jobs/{item['job']['id']}").get_json()
        assert {k: shown[k] for k in item["job"]} == item["job"]


def test_one_invalid_item_inserts_nothing(client: FlaskClient, store: Store,
                                          dispatcher: Dispatcher) -> None:
    jobs = [{"type": "echo"}] * 5 + [{"type": "echo", "priority": "urgent"}, {"type": ""}]
    r = client.post("/api/v1/jobs/batch", json={"jobs": jobs})
    details = assert_error(r, 422, "validation_failed")["details"]
    assert {d["field"] for d in details} == {"jobs[5].priority", "jobs[6].type"}
    assert count_jobs(store) == 0 and redis_ids(dispatcher) == []


def test_batch_conflict_rolls_back_the_whole_batch(client: FlaskClient, store: Store) -> None:
    client.post("/api/v1/jobs", json={"type": "echo", "idempotency_key": "taken"})
    r = client.post("/api/v1/jobs/batch", json={"jobs": [
        {"type": "echo"}, {"type": "echo", "payload": 2, "idempotency_key": "taken"}]})
    assert_error(r, 422, "idempotency_key_reused")
    assert count_jobs(store) == 1


def test_batch_replays_per_item(client: FlaskClient, store: Store) -> None:
    first = client.post("/api/v1/jobs", json={"type": "echo", "idempotency_key": "a"})
    r = client.post("/api/v1/jobs/batch", json={"jobs": [
        {"type": "echo", "idempotency_key": "a"}, {"type": "echo", "idempotency_key": "b"},
        {"type": "echo", "idempotency_key": "b"}]})
    assert r.status_code == 201
    items = r.get_json()["jobs"]
    assert [i["created"] for i in items] == [False, True, False]
    assert items[0]["job"]["id"] == first.get_json()["id"]
    assert items[1]["job"]["id"] == items[2]["job"]["id"]
    assert count_jobs(store) == 2
    again = client.post("/api/v1/jobs/batch", json={"jobs": [
        {"type": "echo", "idempotency_key": "a"}]})
    assert again.status_code == 200 and again.get_json()["replayed"] == 1


def test_concurrent_batches_sharing_keys_neither_deadlock_nor_duplicate(app: Flask,
                                                                         store: Store) -> None:
    keys = [f"k{i}" for i in range(20)]
    barrier = threading.Barrier(6)
    statuses: list[int] = []

    def post(reverse: bool) -> None:
        client = app.test_client()
        jobs = [{"type": "echo", "idempotency_key": k} for k in (keys[::-1] if reverse else keys)]
        barrier.wait()
        statuses.append(client.post("/api/v1/jobs/batch", json={"jobs": jobs}).status_code)

    threads = [threading.Thread(target=post, args=(i % 2 == 0,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(statuses) == 6 and set(statuses) <= {200, 201}
    assert count_jobs(store) == len(keys)


def test_batch_shape_errors(client: FlaskClient, store: Store) -> None:
    for body in ({"jobs": []}, {"jobs": [{"type": "e"}] * 1001}, {"job": []}, [{"type": "e"}],
                 {"jobs": [{"type": "e"}], "extra": 1}, {"jobs": "all"}):
        assert_error(client.post("/api/v1/jobs/batch", json=body), 422, "validation_failed")
    assert count_jobs(store) == 0


def test_batch_refuses_the_idempotency_header(client: FlaskClient, store: Store) -> None:
    r = client.post("/api/v1/jobs/batch", json={"jobs": [{"type": "e"}]},
                    headers={"Idempotency-Key": "k"})
    assert_error(r, 422, "validation_failed")
    assert count_jobs(store) == 0


def test_batch_bad_json_is_400(client: FlaskClient) -> None:
    r = client.post("/api/v1/jobs/batch", data=b'{"jobs": [NaN]}', content_type=JSON)
    assert_error(r, 400, "non_finite_number")


# --- how an enqueue commits -----------------------------------------------------------------

def count_jobs_without_one_event(store: Store) -> int:
    with store.transaction() as conn:
        return conn.exec_driver_sql(
            "SELECT count(*) FROM taskline.jobs j WHERE (SELECT count(*) FROM "
            "taskline.job_events e "
            "WHERE e.job_id = j.id) <> 1").scalar_one()


def test_only_a_batch_with_keys_opens_a_transaction(settings: Settings, store: Store) -> None:
    """Single jobs and batches without keys are one autocommitted statement each, with their
    first events; a batch with keys, which a replay check may refuse, gets a transaction."""
    begins: list[object] = []

    def on_begin(conn: Any) -> None:  # SQLAlchemy "begins" autocommit connections too
        if conn.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
            begins.append(conn)

    event.listen(store.engine, "begin", on_begin)
    app = create_app(settings, store=store)
    try:
        client = app.test_client()
        assert client.post("/api/v1/jobs", json={"type": "echo"}).status_code == 201
        keyed = {"type": "echo", "idempotency_key": "one"}
        assert client.post("/api/v1/jobs", json=keyed).status_code == 201
        assert client.post("/api/v1/jobs", json=keyed).status_code == 200
        batch = {"jobs": [{"type": "echo", "delay_s": 60}, {"type": "echo"}]}
        assert client.post("/api/v1/jobs/batch", json=batch).status_code == 201
        assert begins == []
        keyed_batch = {"jobs": [{"type": "echo", "idempotency_key": "a"}, {"type": "echo"}]}
        assert client.post("/api/v1/jobs/batch", json=keyed_batch).status_code == 201
        assert len(begins) == 1
    finally:
        close_app(app)
    assert count_jobs(store) == 6 and count_jobs_without_one_event(store) == 0


def test_batch_refused_by_one_key_writes_nothing(client: FlaskClient, store: Store,
                                                 dispatcher: Dispatcher) -> None:
    first = client.post("/api/v1/jobs", json={"type": "echo", "idempotency_key": "taken"})
    r = client.post("/api/v1/jobs/batch", json={"jobs": [
        {"type": "echo", "idempotency_key": "a"}, {"type": "echo"},
        {"type": "echo", "payload": 2, "idempotency_key": "taken"},
        {"type": "echo", "idempotency_key": "z"}]})
    assert_error(r, 422, "idempotency_key_reused")
    assert count_jobs(store) == 1 and count_jobs_without_one_event(store) == 0
    assert redis_ids(dispatcher) == [first.get_json()["id"]]


def test_a_dead_pooled_connection_costs_one_503_and_is_replaced(settings: Settings) -> None:
    """The single enqueue runs on the driver's connection: a broken one is discarded (503),
    and the connection the pool hands out next is healthy and out of autocommit."""
    store = Store.connect(settings.database_url, pool_size=1)
    app = create_app(settings, store=store)
    try:
        client = app.test_client()
        assert client.post("/api/v1/jobs", json={"type": "echo"}).status_code == 201
        with psycopg.connect(settings.database_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        assert_error(client.post("/api/v1/jobs", json={"type": "echo"}), 503,
                     "store_unavailable")
        assert client.post("/api/v1/jobs", json={"type": "echo"}).status_code == 201
        pooled = store.engine.raw_connection()
        try:
            assert pooled.driver_connection.autocommit is False
        finally:
            pooled.close()
        assert count_jobs(store) == 2 and count_jobs_without_one_event(store) == 0
    finally:
        close_app(app)
        store.dispose()


def test_payloads_json_cannot_write_fast_still_round_trip(client: FlaskClient) -> None:
    """Integers past 64 bits (which orjson refuses) and non-ASCII text, single and batch."""
    payload = {"big": 10**30, "text": "été 😀", "x": [1.5, -0.0, None, True]}
    r = client.post("/api/v1/jobs", json={"type": "echo", "payload": payload})
    assert r.status_code == 201 and r.get_json()["payload"] == payload
    assert client.get(r.headers["Location"]).get_json()["payload"] == payload
    batch = client.post("/api/v1/jobs/batch", json={"jobs": [{"type": "e", "payload": payload}]})
    assert batch.get_json()["jobs"][0]["job"]["payload"] == payload


# --- metrics --------------------------------------------------------------------------------

def _enqueued(job_type: str, queue: str = "default") -> float:
    return REGISTRY.get_sample_value("job_enqueued_total",
                                     {"type": job_type, "queue": queue}) or 0.0


def test_invented_job_types_do_not_create_unbounded_series(client: FlaskClient) -> None:
    other_before = _enqueued("other")
    prefix = f"invented-{id(client)}-"
    jobs = [{"type": f"{prefix}{i}"} for i in range(80)]
    assert client.post("/api/v1/jobs/batch", json={"jobs": jobs}).status_code == 201
    labelled = [i for i in range(80) if _enqueued(f"{prefix}{i}") > 0]
    assert len(labelled) <= 50
    assert _enqueued("other") - other_before == 80 - len(labelled)
