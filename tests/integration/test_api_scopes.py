"""Scoped static tokens: every /api route by every scope, 403 in the error shape, who am I, and
tokens kept out of logs and Referers.

The route list is read from the app's url_map, so a route added without a scope in
taskline_producer.http.scopes fails here, and so does one whose documented x-required-scope differs.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from werkzeug.routing import Rule

from taskline.access import OPERATE, READ, SCOPES, WRITE
from taskline.settings import Settings
from taskline_producer.app import close_app, create_app
from taskline_producer.http.scopes import ANY_SCOPE, ROUTE_SCOPES
from taskline_producer.routes.apidoc import document

TOKENS = ("writer:w-secret:jobs:write", "reader:r-secret:jobs:read",
          "operator:o-secret:jobs:operate", "all:a-secret:jobs:write+jobs:read+jobs:operate",
          "bare-secret")
SECRET_OF = {WRITE: "w-secret", READ: "r-secret", OPERATE: "o-secret"}
BODIES = {"jobs.create_job": {"type": "echo"}, "jobs.create_batch": {"jobs": [{"type": "echo"}]},
          "workflows.create_workflow": {"name": "w", "steps": [{"id": "a",
                                                                "job": {"type": "echo"}}]}}


@pytest.fixture
def scoped_app(settings: Settings) -> Iterator[Flask]:
    app = create_app(settings.replace(api_tokens=TOKENS))
    yield app
    close_app(app)


def auth(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def api_rules(app: Flask) -> list[tuple[Rule, str]]:
    """(rule, method) of every route under /api/, HEAD and OPTIONS aside."""
    return [(rule, method) for rule in app.url_map.iter_rules()
            if rule.rule.startswith("/api/")
            for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"})]


def call(client: FlaskClient, rule: Rule, method: str, secret: str) -> Any:
    path = re.sub(r"<uuid:\w+>", str(uuid.uuid4()), rule.rule)
    response = client.open(path, method=method, json=BODIES.get(rule.endpoint),
                           headers=auth(secret), buffered=False)
    response.close()  # the event stream never ends by itself
    return response


def test_every_api_route_has_a_scope(app: Flask) -> None:
    missing = [rule.rule for rule, _ in api_rules(app) if rule.endpoint not in ROUTE_SCOPES]
    assert missing == []
    assert set(ROUTE_SCOPES) == {rule.endpoint for rule, _ in api_rules(app)}


def test_the_documented_scope_is_the_enforced_one() -> None:
    doc = document()
    documented = {op["operationId"]: op["x-required-scope"]
                  for path, ops in doc["paths"].items() if path.startswith("/api/")
                  for op in ops.values() if isinstance(op, dict) and "operationId" in op}
    assert set(documented.values()) <= SCOPES | {ANY_SCOPE}
    assert sorted(documented.values()) == sorted(ROUTE_SCOPES.values())


@pytest.mark.parametrize("scope", sorted(SCOPES))
def test_every_route_with_every_single_scope(scoped_app: Flask, scope: str) -> None:
    client = scoped_app.test_client()
    for rule, method in api_rules(scoped_app):
        needed = ROUTE_SCOPES[rule.endpoint]
        response = call(client, rule, method, SECRET_OF[scope])
        if needed in (scope, ANY_SCOPE):
            assert response.status_code not in (401, 403), (rule.rule, method, scope)
        else:
            assert response.status_code == 403, (rule.rule, method, scope)
            error = response.get_json()["error"]
            assert error["code"] == "forbidden" and needed in error["message"]
            assert error["details"] == {"scope": needed, "granted": [scope]}


@pytest.mark.parametrize("secret", ["a-secret", "bare-secret"])
def test_every_scope_and_a_bare_token_open_every_route(scoped_app: Flask, secret: str) -> None:
    client = scoped_app.test_client()
    for rule, method in api_rules(scoped_app):
        assert call(client, rule, method, secret).status_code not in (401, 403), rule.rule


def test_a_refused_enqueue_writes_nothing(scoped_app: Flask, store: Any) -> None:
    client = scoped_app.test_client()
    for path, body in (("/api/v1/jobs", {"type": "echo"}),
                       ("/api/v1/jobs/batch", {"jobs": [{"type": "echo"}]})):
        assert client.post(path, json=body, headers=auth("r-secret")).status_code == 403
    assert store.list_jobs(status=None, type=None, queue=None, after=None, limit=5) == []


def test_whoami_names_the_token_and_its_scopes(scoped_app: Flask, client: FlaskClient) -> None:
    scoped = scoped_app.test_client()
    assert scoped.get("/api/v1/whoami", headers=auth("r-secret")).get_json() == {
        "name": "reader", "kind": "token", "scopes": [READ], "authentication": True}
    bare = scoped.get("/api/v1/whoami", headers=auth("bare-secret")).get_json()
    assert bare["name"] == "token-5" and bare["scopes"] == sorted(SCOPES)
    assert scoped.get("/api/v1/whoami").status_code == 401
    assert client.get("/api/v1/whoami").get_json() == {
        "name": None, "kind": "anonymous", "scopes": sorted(SCOPES), "authentication": False}


def test_unknown_paths_need_a_token_before_they_are_not_found(scoped_app: Flask) -> None:
    client = scoped_app.test_client()
    assert client.get("/api/v1/nowhere").status_code == 401
    assert client.get("/api/v1/nowhere", headers=auth("w-secret")).status_code == 404
    assert client.put("/api/v1/jobs", headers=auth("w-secret")).status_code == 405


def test_the_stream_token_reaches_no_log_and_no_referer(
        scoped_app: Flask, caplog: pytest.LogCaptureFixture) -> None:
    client = scoped_app.test_client()
    with caplog.at_level(logging.DEBUG):
        for token in ("r-secret", "w-secret", "wrong-secret"):
            response = client.get(f"/api/v1/events?token={token}", buffered=False)
            response.close()
            assert response.headers["Referrer-Policy"] == "no-referrer"
        client.get("/api/v1/queues?token=r-secret")  # only the stream takes ?token=
    assert client.get("/api/v1/jobs?token=r-secret").status_code == 401
    for secret in ("r-secret", "w-secret", "wrong-secret"):
        assert secret not in caplog.text
    assert client.get("/dashboard").headers["Referrer-Policy"] == "no-referrer"


def test_a_stream_token_without_read_is_forbidden(scoped_app: Flask) -> None:
    response = scoped_app.test_client().get("/api/v1/events?token=w-secret")
    assert response.status_code == 403
    assert response.get_json()["error"]["details"]["scope"] == READ


def test_the_apis_address_leads_to_the_dashboard_without_a_token(scoped_app: Flask) -> None:
    """`make run` prints the API's address; opened in a browser it shows the dashboard, whose
    page asks for the token (the API's routes keep requiring one)."""
    client = scoped_app.test_client()
    root = client.get("/")
    assert root.status_code == 302 and root.headers["Location"] == "/dashboard"
    assert client.get("/", follow_redirects=True).status_code == 200
    assert client.get("/api/v1/jobs").status_code == 401
