"""The event stream under the real `taskline api` (gunicorn gthread): streams never starve requests.

Invariants checked: a gunicorn worker serves at most half its threads as streams (503 with
Retry-After beyond) while ordinary requests keep being answered; a change accepted over HTTP
reaches every open stream; SIGTERM ends the streams at once (a `dropped` event with reason
`shutdown`) instead of holding the graceful stop for graceful_timeout.
"""

from __future__ import annotations

import http.client
import json
import runpy
from pathlib import Path

import pytest

from taskline.settings import Settings
from taskline_cli.localservers import free_port
from taskline_producer.http.serve import CONFIG_FILE
from tests.helpers import service, service_env, wait_for
from tests.integration.events_client import SseClient

pytestmark = pytest.mark.slow

TOKEN = "gunicorn-stream-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def call(port: int, method: str, path: str, body: object = None) -> tuple[int, object]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        headers = {**AUTH, "Content-Type": "application/json"}
        conn.request(method, path, body=None if body is None else json.dumps(body),
                     headers=headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        conn.close()


def ready(port: int) -> bool:
    try:
        return call(port, "GET", "/readyz")[0] == 200
    except OSError:
        return False


def test_streams_take_half_the_threads_and_end_at_sigterm(settings: Settings,
                                                          tmp_path: Path) -> None:
    threads = runpy.run_path(str(CONFIG_FILE))["threads"]
    cap = threads // 2
    assert cap >= 2
    port = free_port()
    env = service_env(settings, TASKLINE_API_TOKENS=TOKEN)
    with service(["api", "--bind", f"127.0.0.1:{port}", "--workers", "1"], env,
                 tmp_path / "logs") as proc:
        wait_for(lambda: ready(port) or proc.poll() is not None, timeout=20, message="api up")
        assert proc.poll() is None, f"taskline api exited; see {tmp_path / 'logs'}"
        streams = [SseClient(port, f"/api/v1/events?token={TOKEN}") for _ in range(cap)]
        assert [s.status for s in streams] == [200] * cap
        refused = SseClient(port, "/api/v1/events", AUTH)
        assert refused.status == 503 and refused.body()["error"]["code"] == "too_many_streams"
        assert refused.response.getheader("Retry-After") == "5"
        refused.close()
        status, job = call(port, "POST", "/api/v1/jobs", {"type": "echo", "payload": 1})
        assert status == 201  # ordinary requests are served while every stream slot is taken
        assert call(port, "GET", "/api/v1/queues")[0] == 200
        for stream in streams:
            change = stream.next_event().json()
            assert (change["job_id"], change["event"]) == (job["id"], "enqueued")
        proc.terminate()
        for stream in streams:
            assert stream.next_event("dropped").json() == {"reason": "shutdown"}
            stream.close()
        assert proc.wait(15) == 0
