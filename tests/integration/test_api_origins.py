"""Browser guards against real PostgreSQL and Redis: a Host the API does not answer to is 400
`bad_host` (DNS rebinding), /healthz, /readyz and /metrics aside; with authentication off, a
state-changing request from another site's page is 403 `forbidden_origin` and changes nothing,
while requests without an Origin (curl, the Python client) and the dashboard's own are served.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from taskline.settings import Settings
from taskline.store.store import Store
from taskline_producer.app import close_app, create_app
from taskline_producer.http.serve import ProducerServer, gunicorn_options
from tests.integration.test_api_jobs import make_dead

FOREIGN = {"Origin": "http://evil.example"}
# A form on another site: no Content-Type, no body, an Origin of its own.
CROSS_SITE = [FOREIGN, {"Origin": "null"}, {"Origin": "http://localhost:3000"},
              {"Origin": "https://localhost.evil.example"}, {"Sec-Fetch-Site": "cross-site"},
              {"Origin": "http://localhost", "Sec-Fetch-Site": "cross-site"}]


@pytest.fixture
def make_client(settings: Settings) -> Iterator[Any]:
    made: list[Flask] = []

    def make(binds: tuple[str, ...] = (), **changes: Any) -> FlaskClient:
        made.append(create_app(settings.replace(**changes), binds=binds))
        return made[-1].test_client()

    yield make
    for app in made:
        close_app(app)


def assert_error(response: Any, status: int, code: str) -> dict:
    assert response.status_code == status, response.get_data(as_text=True)
    error = response.get_json()["error"]
    assert set(error) == {"code", "message", "details"} and error["code"] == code
    return error


def paused(store: Store) -> set[str]:
    return set(store.paused_queues())


def test_a_cross_site_request_changes_nothing_with_auth_off(client: FlaskClient, store: Store,
                                                            dispatcher: Any) -> None:
    job = client.post("/api/v1/jobs", json={"type": "echo"}).get_json()
    dead = client.post("/api/v1/jobs", json={"type": "echo"}).get_json()
    make_dead(store, dispatcher, dead["id"])
    for headers in CROSS_SITE:
        for method, path, body in (
                ("POST", "/api/v1/queues/default/pause", None),
                ("POST", f"/api/v1/jobs/{dead['id']}/retry", None),
                ("DELETE", f"/api/v1/jobs/{job['id']}", None),
                ("POST", "/api/v1/jobs", {"type": "echo"}),
                ("PUT", "/api/v1/limits/type:echo", {"concurrency": 1}),
                ("PATCH", "/api/v1/jobs", None)):
            r = client.open(path, method=method, json=body, headers=headers)
            assert_error(r, 403, "forbidden_origin")
    assert paused(store) == set()
    assert store.get_job(job["id"]).status == "queued"
    assert store.get_job(dead["id"]).status == "dead"
    with store.transaction() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM taskline.jobs").scalar_one() == 2
        assert conn.exec_driver_sql("SELECT count(*) FROM taskline.flow_limits").scalar_one() \
            == 0


def test_requests_without_origin_and_same_origin_ones_are_served(client: FlaskClient,
                                                                  store: Store) -> None:
    # curl and the Python client send no Origin; the dashboard sends its own.
    assert client.post("/api/v1/queues/a/pause").status_code == 200
    own = {"Origin": "http://localhost", "Sec-Fetch-Site": "same-origin"}
    assert client.post("/api/v1/queues/b/pause", headers=own).status_code == 200
    assert client.post("/api/v1/queues/c/pause", headers={"Origin": "http://LOCALHOST:80"},
                       ).status_code == 200
    assert paused(store) == {"a", "b", "c"}
    # Reading is no change: a foreign Origin on a GET is answered (the browser keeps the
    # answer from the other site's page, which gets no CORS header).
    assert client.get("/api/v1/queues", headers=FOREIGN).status_code == 200
    r = client.post("/api/v1/queues/a/resume", headers={"Origin": "http://127.0.0.1:8000",
                                                        "Host": "127.0.0.1:8000"})
    assert r.status_code == 200


def test_behind_a_proxy_the_public_name_and_https_origin_are_the_dashboards_own(
        make_client: Any, store: Store) -> None:
    client = make_client(allowed_hosts=("taskline.example",))
    headers = {"Origin": "https://taskline.example", "Host": "taskline.example"}
    assert client.post("/api/v1/queues/q/pause", headers=headers).status_code == 200
    headers["Origin"] = "https://taskline.example:8443"
    assert_error(client.post("/api/v1/queues/q/resume", headers=headers), 403,
                 "forbidden_origin")
    assert paused(store) == {"q"}


def test_with_auth_on_the_token_decides(make_client: Any) -> None:
    client = make_client(api_tokens=("ops:o-secret",))
    r = client.post("/api/v1/queues/q/pause", headers={**FOREIGN,
                                                        "Authorization": "Bearer o-secret"})
    assert r.status_code == 200
    assert_error(client.post("/api/v1/queues/q/pause", headers=FOREIGN), 401, "unauthorized")


def test_an_unknown_host_is_400_but_health_and_metrics_answer(client: FlaskClient,
                                                               store: Store) -> None:
    rebound = {"Host": "rebound.evil.example:8000"}
    for method, path in (("GET", "/api/v1/jobs"), ("GET", "/api/v1/whoami"),
                         ("POST", "/api/v1/queues/default/pause"), ("GET", "/dashboard"),
                         ("GET", "/api/v1/nowhere")):
        error = assert_error(client.open(path, method=method, headers=rebound), 400, "bad_host")
        assert error["details"] == {"host": "rebound.evil.example"}
    assert paused(store) == set()
    for path in ("/healthz", "/readyz", "/metrics"):
        assert client.get(path, headers=rebound).status_code == 200, path
    for host in ("localhost", "LOCALHOST.", "localhost:8000", "127.0.0.1:8000", "[::1]:8000",
                 "10.1.2.3", "[fe80::1]"):
        assert client.get("/api/v1/whoami", headers={"Host": host}).status_code == 200, host


def test_allowed_hosts_and_the_bind_address_add_names(make_client: Any) -> None:
    client = make_client(binds=("api-host:8000",), allowed_hosts=("taskline.example", "api"))
    for host in ("api-host:8000", "taskline.example", "Taskline.Example:443", "api"):
        assert client.get("/api/v1/whoami", headers={"Host": host}).status_code == 200, host
    for host in ("example", "taskline.example.evil", "sub.taskline.example"):
        assert_error(client.get("/api/v1/whoami", headers={"Host": host}), 400, "bad_host")
    anything = make_client(allowed_hosts=("*",))
    assert anything.get("/api/v1/whoami", headers={"Host": "any.example"}).status_code == 200


def test_the_server_answers_to_the_host_it_is_bound_to(settings: Settings) -> None:
    """`taskline api --bind NAME:PORT` passes NAME on to the app each worker builds."""
    name = socket.gethostname().lower()
    server = ProducerServer(settings, gunicorn_options(f"{name}:0", 1))
    app = server.load()
    try:
        client = app.test_client()
        assert client.get("/api/v1/whoami", headers={"Host": f"{name}:8000"}).status_code == 200
        assert_error(client.get("/api/v1/whoami", headers={"Host": "other.example"}), 400,
                     "bad_host")
    finally:
        close_app(app)
