"""Operations, health, auth, outages, metrics and the OpenAPI document of the producer API.

Outages are made by pointing the app at a closed port on 127.0.0.1 (nothing is stopped): the
API must answer 503 with Retry-After and accept nothing it cannot keep.
"""

from __future__ import annotations

import json
import logging
import re
import socket
from collections.abc import Iterator
from typing import Any

import jsonschema_rs
import pytest
from flask import Flask
from flask.testing import FlaskClient

from taskline.dispatch.dispatcher import Dispatcher
from taskline.settings import Settings
from taskline.store.store import Store
from taskline_producer.app import close_app, create_app
from taskline_producer.routes.apidoc import document

TOKENS = ("first-token", "second-token")


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def make_app(settings: Settings) -> Iterator[Any]:
    made: list[Flask] = []

    def make(**changes: Any) -> FlaskClient:
        made.append(create_app(settings.replace(**changes)))
        return made[-1].test_client()

    yield make
    for app in made:
        close_app(app)


def assert_error(response: Any, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.get_data(as_text=True)
    assert response.mimetype == "application/json"
    error = response.get_json()["error"]
    assert set(error) == {"code", "message", "details"}
    if code:
        assert error["code"] == code
    return error


def count_jobs(store: Store) -> int:
    with store.transaction() as conn:
        return conn.exec_driver_sql("SELECT count(*) FROM taskline.jobs").scalar_one()


# --- workers and queues ---------------------------------------------------------------------

def test_workers_lists_live_workers_only(client: FlaskClient, store: Store) -> None:
    store.upsert_worker("w-live", "host-a", 101, ["default", "mail"], 4)
    store.upsert_worker("w-silent", "host-b", 102, ["default"], 2)
    store.upsert_worker("w-stopped", "host-c", 103, ["default"], 2)
    store.stop_worker("w-stopped")
    with store.transaction() as conn:  # backdate: silent for an hour
        conn.exec_driver_sql("UPDATE taskline.workers SET last_heartbeat = now() - interval '1 "
                             "hour' "
                             "WHERE id = 'w-silent'")
    workers = client.get("/api/v1/workers").get_json()["workers"]
    assert [w["id"] for w in workers] == ["w-live"]
    assert workers[0]["queues"] == ["default", "mail"] and workers[0]["concurrency"] == 4
    assert workers[0]["job_ids"] == [] and workers[0]["heartbeat_age_s"] >= 0
    assert workers[0]["cpus"] is None  # not pinned
    store.upsert_worker("w-live", "host-a", 101, ["default", "mail"], 4, cpus=[3, 1])
    (pinned,) = client.get("/api/v1/workers").get_json()["workers"]
    assert pinned["cpus"] == [3, 1] and pinned["concurrency"] == 4


def test_queues_report_postgresql_counts_and_redis_depths(client: FlaskClient,
                                                          dispatcher: Dispatcher) -> None:
    for fields in ({"priority": 9}, {"priority": 9}, {"priority": 1}, {"delay_s": 60},
                   {"queue": "mail"}):
        assert client.post("/api/v1/jobs", json={"type": "echo", **fields}).status_code == 201
    dispatcher.push([("redis-only", 3, "00000000-0000-4000-8000-000000000001")])
    queues = {q["name"]: q for q in client.get("/api/v1/queues").get_json()["queues"]}
    assert set(queues) == {"default", "mail", "redis-only"}
    default = queues["default"]
    assert default["counts"] == {"scheduled": 1, "queued": 3, "retrying": 0, "running": 0,
                                 "dead": 0, "waiting": 0}
    assert default["priorities"]["9"]["queued"] == 2
    assert default["priorities"]["5"]["scheduled"] == 1
    assert default["redis"]["ready"]["9"] == 2 and default["redis"]["ready_total"] == 3
    assert default["redis"]["scheduled"] == 1
    assert queues["redis-only"]["counts"]["queued"] == 0
    assert queues["redis-only"]["redis"]["ready_total"] == 1


# --- health ---------------------------------------------------------------------------------

def test_health_and_readiness(client: FlaskClient) -> None:
    assert client.get("/healthz").get_json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.get_json() == {"status": "ready", "checks": {"postgresql": "ok", "redis": "ok"}}


def test_readyz_is_200_degraded_when_redis_is_unreachable(make_app: Any,
                                                         closed_port: int) -> None:
    # Accepting a job needs PostgreSQL only: a Redis outage must not take the API out.
    client = make_app(redis_url=f"redis://127.0.0.1:{closed_port}/0")
    r = client.get("/readyz")
    assert r.status_code == 200
    body = r.get_json()
    assert body["status"] == "degraded" and body["checks"]["postgresql"] == "ok"
    assert "Redis unavailable" in body["checks"]["redis"]
    assert client.get("/healthz").status_code == 200


def test_readyz_is_503_when_postgresql_is_unreachable(make_app: Any, closed_port: int) -> None:
    client = make_app(database_url=f"postgresql://root@127.0.0.1:{closed_port}/x")
    r = client.get("/readyz")
    assert r.status_code == 503
    assert "PostgreSQL unavailable" in r.get_json()["checks"]["postgresql"]
    assert r.get_json()["checks"]["redis"] == "ok"


UUID = "00000000-0000-4000-8000-000000000000"
STORE_ROUTES = [("post", "/api/v1/jobs", {"type": "echo"}),
                ("post", "/api/v1/jobs/batch", {"jobs": [{"type": "echo"}]}),
                ("get", "/api/v1/jobs", None), ("get", f"/api/v1/jobs/{UUID}", None),
                ("delete", f"/api/v1/jobs/{UUID}", None),
                ("post", f"/api/v1/jobs/{UUID}/retry", None), ("get", "/api/v1/dlq", None),
                ("get", "/api/v1/workers", None), ("get", "/api/v1/queues", None),
                ("post", "/api/v1/workflows",
                 {"name": "w", "steps": [{"id": "a", "job": {"type": "echo"}}]}),
                ("get", "/api/v1/workflows", None), ("get", f"/api/v1/workflows/{UUID}", None),
                ("delete", f"/api/v1/workflows/{UUID}", None)]


def test_postgresql_unreachable_is_503_with_retry_after(make_app: Any, closed_port: int,
                                                        dispatcher: Dispatcher,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    client = make_app(database_url=f"postgresql://root@127.0.0.1:{closed_port}/x")
    with caplog.at_level(logging.ERROR):
        for method, path, body in STORE_ROUTES:
            r = getattr(client, method)(path, json=body)
            assert_error(r, 503, "store_unavailable")
            assert r.headers["Retry-After"] == "5"
    assert "unhandled error" not in caplog.text
    assert dispatcher.known_queues() == set()  # nothing accepted, nothing pushed


def test_redis_unreachable_on_queues_reports_the_postgres_mode(make_app: Any, closed_port: int,
                                                               store: Store) -> None:
    client = make_app(redis_url=f"redis://127.0.0.1:{closed_port}/0")
    assert client.post("/api/v1/jobs", json={"type": "echo"}).status_code == 201
    r = client.get("/api/v1/queues")
    assert r.status_code == 200
    body = r.get_json()
    assert body["dispatch"] == {"mode": "postgres", "redis": "unreachable",
                                "rebuilt_age_s": None}
    (queue,) = body["queues"]
    assert queue["counts"]["queued"] == 1 and queue["redis"] is None


def test_queues_report_the_redis_mode_while_the_rebuild_marker_is_fresh(
        client: FlaskClient, store: Store, dispatcher) -> None:
    assert client.get("/api/v1/queues").get_json()["dispatch"]["mode"] == "rebuilding"
    now_ms = int(store.now().timestamp() * 1000)
    dispatcher.set_dispatch_marker(f"t:{now_ms}")
    dispatch = client.get("/api/v1/queues").get_json()["dispatch"]
    assert dispatch["mode"] == "redis" and dispatch["redis"] == "ok"
    assert 0 <= dispatch["rebuilt_age_s"] < 5
    dispatcher.set_dispatch_marker(f"t:{now_ms - 60_000}")  # an old snapshot's marker
    assert client.get("/api/v1/queues").get_json()["dispatch"]["mode"] == "rebuilding"


def test_redis_unreachable_cancel_and_retry_still_change_postgresql(
        make_app: Any, closed_port: int, store: Store) -> None:
    client = make_app(redis_url=f"redis://127.0.0.1:{closed_port}/0")
    job = client.post("/api/v1/jobs", json={"type": "echo", "delay_s": 60}).get_json()
    assert client.delete(f"/api/v1/jobs/{job['id']}").status_code == 200
    assert store.get_job(job["id"]).status == "cancelled"


# --- auth -----------------------------------------------------------------------------------

def test_auth_requires_a_configured_bearer_token(make_app: Any, store: Store) -> None:
    client = make_app(api_tokens=TOKENS)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic Zmlyc3Q="},
                    {"Authorization": "Bearer first-token-and-more"},
                    {"Authorization": "Bearer fïrst"}):
        r = client.post("/api/v1/jobs", json={"type": "echo"}, headers=headers)
        assert_error(r, 401, "unauthorized")
        assert r.headers["WWW-Authenticate"].startswith('Bearer realm="taskline"')
    assert count_jobs(store) == 0
    for token in TOKENS:
        r = client.post("/api/v1/jobs", json={"type": "echo"},
                        headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 201
    assert count_jobs(store) == 2


def test_auth_covers_every_api_path_and_leaves_health_open(make_app: Any) -> None:
    client = make_app(api_tokens=TOKENS)
    for path in ("/api/v1/jobs", "/api/v1/queues", "/api/v1/openapi.json", "/api/v1/unknown",
                 f"/api/v1/jobs/{UUID}"):
        assert_error(client.get(path), 401, "unauthorized")
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200
    assert client.get("/metrics").status_code == 200
    auth = {"Authorization": "Bearer second-token"}
    assert_error(client.get("/api/v1/unknown", headers=auth), 404, "not_found")


def test_openapi_declares_bearer_only_when_tokens_are_configured(client: FlaskClient,
                                                                 make_app: Any) -> None:
    plain = client.get("/api/v1/openapi.json").get_json()
    assert "security" not in plain and "securitySchemes" not in plain["components"]
    secured = make_app(api_tokens=TOKENS).get(
        "/api/v1/openapi.json", headers={"Authorization": "Bearer first-token"}).get_json()
    assert secured["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert secured["security"] == [{"bearer": []}]
    assert secured["paths"]["/healthz"]["get"]["security"] == []


# --- every response is JSON; the catch-all ----------------------------------------------------

def test_routing_errors_are_json(client: FlaskClient) -> None:
    assert_error(client.get("/nowhere"), 404, "not_found")
    # No HTML redirect. The test client reads `//api` as a host name: name the real one.
    assert_error(client.get("//api/v1/jobs", headers={"Host": "localhost"}), 404, "not_found")
    r = client.put("/api/v1/jobs")
    assert_error(r, 405, "method_not_allowed")
    assert set(r.headers["Allow"].replace(" ", "").split(",")) == {"GET", "HEAD", "POST"}
    assert_error(client.options("/api/v1/jobs"), 405, "method_not_allowed")
    assert_error(client.patch(f"/api/v1/jobs/{UUID}"), 405, "method_not_allowed")
    r = client.get("/api/v1/jobs/batch")
    assert_error(r, 405, "method_not_allowed")
    assert r.headers["Allow"] == "POST"


def test_an_unexpected_error_is_a_logged_500_in_the_error_shape(
        app: Flask, caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> None:
        raise RuntimeError("a bug")

    app.add_url_rule("/api/v1/broken", view_func=broken)
    with caplog.at_level(logging.ERROR, logger="taskline_producer.schemas.errors"):
        r = app.test_client().get("/api/v1/broken")
    error = assert_error(r, 500, "internal_error")
    assert "a bug" not in error["message"]
    assert "RuntimeError: a bug" in caplog.text


# --- metrics --------------------------------------------------------------------------------

def test_metrics_count_requests_by_route_template(client: FlaskClient) -> None:
    job = client.post("/api/v1/jobs", json={"type": "echo"}).get_json()
    client.get(f"/api/v1/jobs/{job['id']}")
    client.get("/api/v1/jobs/not-a-uuid-at-all")
    client.get("/some/made-up/path")
    r = client.get("/metrics")
    assert r.status_code == 200 and r.mimetype == "text/plain"
    text = r.get_data(as_text=True)
    assert 'route="/api/v1/jobs/<uuid:job_id>"' in text
    assert 'route="unmatched"' in text
    assert job["id"] not in text and "not-a-uuid-at-all" not in text
    assert "made-up" not in text
    assert 'job_enqueued_total{queue="default",type="echo"}' in text


def test_invented_methods_share_one_label(client: FlaskClient) -> None:
    client.open("/healthz", method="BREW")
    text = client.get("/metrics").get_data(as_text=True)
    assert 'method="other"' in text and "BREW" not in text


# --- the OpenAPI document -------------------------------------------------------------------

def _validator(doc: dict, name: str) -> jsonschema_rs.Validator:
    schema = {**doc, "$ref": f"#/components/schemas/{name}"}
    return jsonschema_rs.Draft202012Validator(schema, validate_formats=True)


def _flask_rule(path: str) -> str:
    """An OpenAPI path as the Flask rule serving it (job ids go through the uuid converter)."""
    converters = {"job_id": "uuid:job_id", "scope": "path:scope",
                  "workflow_id": "uuid:workflow_id"}
    return re.sub(r"\{(\w+)\}", lambda m: f"<{converters.get(m[1], m[1])}>", path)


def test_openapi_document_is_valid_openapi_31(client: FlaskClient) -> None:
    from schemathesis.specs.openapi.definitions import OPENAPI_31_VALIDATOR

    r = client.get("/api/v1/openapi.json")
    assert r.status_code == 200
    doc = r.get_json()
    assert doc == document()  # the packaged file, served as it is when no tokens are set
    assert doc["openapi"].startswith("3.1")
    assert list(OPENAPI_31_VALIDATOR.iter_errors(doc)) == []
    for name in doc["components"]["schemas"]:
        jsonschema_rs.meta.validate(doc["components"]["schemas"][name])
        _validator(doc, name)
    served = {(rule.rule, m) for rule in client.application.url_map.iter_rules()
              for m in rule.methods - {"HEAD", "OPTIONS"}}
    documented = {(_flask_rule(p), m.upper())
                  for p, ops in doc["paths"].items() for m in ops if m != "parameters"}
    assert served == documented


def test_real_responses_match_the_document(client: FlaskClient, store: Store) -> None:
    doc = client.get("/api/v1/openapi.json").get_json()
    job = client.post("/api/v1/jobs", json={"type": "echo", "payload": [1, "two"],
                                            "delay_s": 5}).get_json()
    store.upsert_worker("w-1", "host", 1, ["default"], 2)
    checks = [
        ("Job", job),
        ("JobDetail", client.get(f"/api/v1/jobs/{job['id']}").get_json()),
        ("JobPage", client.get("/api/v1/jobs?limit=1").get_json()),
        ("BatchResult", client.post("/api/v1/jobs/batch",
                                    json={"jobs": [{"type": "e"}]}).get_json()),
        ("DeadPage", client.get("/api/v1/dlq").get_json()),
        ("WorkerList", client.get("/api/v1/workers").get_json()),
        ("QueueList", client.get("/api/v1/queues").get_json()),
        ("Readiness", client.get("/readyz").get_json()),
        ("Health", client.get("/healthz").get_json()),
        ("Error", client.get("/api/v1/jobs/nope").get_json()),
        ("Error", client.post("/api/v1/jobs", json={"type": 1}).get_json()),
    ]
    for name, instance in checks:
        errors = [e.message for e in _validator(doc, name).iter_errors(instance)]
        assert errors == [], (name, json.dumps(instance)[:300])
