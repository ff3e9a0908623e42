"""The client's retry rules, against a scripted HTTP server on 127.0.0.1 (in a thread).

The real API cannot be made to answer 503 on cue, or to drop a connection mid-request, so a
small server plays those parts; what the client sends (bodies, idempotency keys, attempt
counts) is recorded and asserted. Waits go through an injected sleep that records them.
"""

from __future__ import annotations

import json
import socket
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from taskline.client import Client, ClientError

THEN_CLOSE = "X-Then-Close"


class ScriptedApi(BaseHTTPRequestHandler):
    """Answers each request with the next scripted (status, headers, body); `drop` hangs up."""

    protocol_version = "HTTP/1.1"

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.server.seen.append({"method": self.command, "path": self.path, "body": body,
                                 "headers": dict(self.headers),
                                 "port": self.client_address[1]})
        script = self.server.script
        status, headers, payload = script.pop(0) if len(script) > 1 else script[0]
        if status == "drop":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        for name, value in {"Content-Type": "application/json", **headers}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)
        if headers.get(THEN_CLOSE):  # hang up on the idle connection, unannounced
            self.close_connection = True

    do_GET = do_POST = do_DELETE = _handle

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def api() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), ScriptedApi)
    server.seen, server.script = [], [(200, {}, {})]
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(5)


def _client(server: ThreadingHTTPServer, waits: list[float], **kwargs: Any) -> Client:
    return Client(f"http://127.0.0.1:{server.server_address[1]}/", sleep=waits.append,
                  **kwargs)


UNAVAILABLE = (503, {"Retry-After": "7"},
               {"error": {"code": "store_unavailable", "message": "PostgreSQL is down",
                          "details": None}})
CREATED = (201, {"Location": "/api/v1/jobs/x"}, {"id": "x", "status": "queued"})


def test_503_is_retried_with_one_idempotency_key(api: ThreadingHTTPServer) -> None:
    api.script = [UNAVAILABLE, UNAVAILABLE, CREATED]
    waits: list[float] = []
    with _client(api, waits, attempts=3) as client:
        job = client.enqueue("echo", {"a": 1}, priority="high")
    assert job == {"id": "x", "status": "queued"}
    assert waits == [7.0, 7.0]
    bodies = [seen["body"] for seen in api.seen]
    assert len(bodies) == 3 and all(b == bodies[0] for b in bodies)
    assert str(uuid.UUID(bodies[0]["idempotency_key"])) == bodies[0]["idempotency_key"]
    assert bodies[0] == {"type": "echo", "payload": {"a": 1}, "priority": "high",
                         "idempotency_key": bodies[0]["idempotency_key"]}
    assert {seen["path"] for seen in api.seen} == {"/api/v1/jobs"}


def test_each_enqueue_gets_its_own_key_unless_given(api: ThreadingHTTPServer) -> None:
    api.script = [CREATED]
    with _client(api, []) as client:
        client.enqueue("echo")
        client.enqueue("echo")
        client.enqueue("echo", idempotency_key="order-42")
    keys = [seen["body"]["idempotency_key"] for seen in api.seen]
    assert keys[0] != keys[1] and keys[2] == "order-42"
    assert "payload" not in api.seen[0]["body"]


def test_503_attempts_are_bounded_and_waits_capped(api: ThreadingHTTPServer) -> None:
    api.script = [(503, {"Retry-After": "999"}, UNAVAILABLE[2])]
    waits: list[float] = []
    with _client(api, waits, attempts=3, max_wait_s=2.5) as client, \
            pytest.raises(ClientError) as info:
        client.get(uuid.uuid4())
    assert (info.value.status, info.value.code) == (503, "store_unavailable")
    assert info.value.message == "PostgreSQL is down"
    assert len(api.seen) == 3
    assert waits == [2.5, 2.5]


def test_other_errors_are_raised_at_once_with_the_error_shape(api: ThreadingHTTPServer) -> None:
    details = [{"field": "priority", "message": "must be 0..9"}]
    api.script = [(422, {}, {"error": {"code": "validation_failed", "message": "bad",
                                       "details": details}})]
    with _client(api, []) as client, pytest.raises(ClientError) as info:
        client.enqueue("echo", priority=12)
    assert (info.value.status, info.value.code, info.value.details) == (
        422, "validation_failed", details)
    assert len(api.seen) == 1


def test_an_error_page_that_is_not_json_is_summarised(api: ThreadingHTTPServer) -> None:
    api.script = [(502, {"Content-Type": "text/html"}, b"<html>bad gateway</html>")]
    with _client(api, []) as client, pytest.raises(ClientError) as info:
        client.queues()
    assert (info.value.status, info.value.code) == (502, "http_502")
    assert "bad gateway" in info.value.message


def test_unreachable_api_is_retried_then_reported() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    waits: list[float] = []
    with Client(f"http://127.0.0.1:{port}", attempts=3, sleep=waits.append) as client, \
            pytest.raises(ClientError) as info:
        client.retry(uuid.uuid4())
    assert (info.value.status, info.value.code) == (0, "unreachable")
    assert len(waits) == 2


def test_a_dropped_requeue_is_not_replayed_but_a_dropped_read_is(
        api: ThreadingHTTPServer) -> None:
    api.script = [("drop", {}, None), (200, {}, {"id": "x", "status": "queued"})]
    with _client(api, [], attempts=3) as client, pytest.raises(ClientError) as info:
        client.retry("x")
    assert info.value.code == "connection_lost"
    assert len(api.seen) == 1
    api.script = [("drop", {}, None), (200, {}, {"id": "x", "status": "dead"})]
    with _client(api, [], attempts=3) as client:
        assert client.get("x")["status"] == "dead"
    assert len(api.seen) == 3


def test_paths_queries_and_token(api: ThreadingHTTPServer) -> None:
    api.script = [(200, {}, {"jobs": []})]
    with _client(api, [], token="s3cret") as client:
        client.list(status="dead", queue="emails", limit=5)
        client.dlq(queue="emails")
        client.get("../workers")
        client.cancel("abc")
        client.workers()
        client.enqueue_batch([{"type": "echo"}, {"type": "echo", "idempotency_key": "k"}])
    assert [(s["method"], s["path"]) for s in api.seen] == [
        ("GET", "/api/v1/jobs?status=dead&queue=emails&limit=5"),
        ("GET", "/api/v1/dlq?queue=emails"),
        ("GET", "/api/v1/jobs/..%2Fworkers"),
        ("DELETE", "/api/v1/jobs/abc"),
        ("GET", "/api/v1/workers"),
        ("POST", "/api/v1/jobs/batch"),
    ]
    assert {s["headers"]["Authorization"] for s in api.seen} == {"Bearer s3cret"}
    jobs = api.seen[-1]["body"]["jobs"]
    assert jobs[1]["idempotency_key"] == "k" and uuid.UUID(jobs[0]["idempotency_key"])
