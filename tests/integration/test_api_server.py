"""`taskline api` as a real gunicorn subprocess: enqueue over HTTP, limits, shared metrics.

Invariant checked: the CLI entry point serves the app under gunicorn with several worker
processes, each with its own connections, and /metrics merges the samples of every process.
"""

from __future__ import annotations

import http.client
import json
from pathlib import Path

import pytest

from taskline.dispatch.dispatcher import Dispatcher
from taskline.dispatch.keys import QueueKeys
from taskline.settings import Settings
from taskline.store.store import Store
from taskline_cli.localservers import free_port
from tests.helpers import service, service_env, stop_process, wait_for

pytestmark = pytest.mark.slow


def request(port: int, method: str, path: str, body: bytes | None = None,
            headers: dict[str, str] | None = None,
            chunked: bool = False) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        if chunked:
            conn.request(method, path, body=iter([body or b""]), headers=headers or {},
                         encode_chunked=True)
        else:
            conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def up(port: int) -> bool:
    try:
        return request(port, "GET", "/healthz")[0] == 200
    except OSError:
        return False


def post_json(port: int, body: object, chunked: bool = False) -> tuple[int, dict, dict]:
    status, headers, raw = request(port, "POST", "/api/v1/jobs", json.dumps(body).encode(),
                                   {"Content-Type": "application/json"}, chunked=chunked)
    return status, headers, json.loads(raw)


def requests_counted(port: int, route: str, status: int) -> float:
    """The sum over every gunicorn process of taskline_http_requests_total for POSTs."""
    code, _, raw = request(port, "GET", "/metrics")
    assert code == 200
    return sum(float(line.rsplit(" ", 1)[1]) for line in raw.decode().splitlines()
               if line.startswith("taskline_http_requests_total{")
               and f'route="{route}"' in line and f'status="{status}"' in line)


def test_gunicorn_serves_the_api(settings: Settings, store: Store, dispatcher: Dispatcher,
                                 tmp_path: Path) -> None:
    port = free_port()
    env = service_env(settings, TASKLINE_MAX_PAYLOAD_BYTES="4096",
                      PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "metrics"))
    with service(["api", "--bind", f"127.0.0.1:{port}", "--workers", "2"], env,
                 tmp_path / "logs") as proc:
        wait_for(lambda: up(port) or proc.poll() is not None, timeout=20, message="api up")
        assert proc.poll() is None, "taskline api exited; see its log in " + str(tmp_path)
        ids = []
        for i in range(6):  # one connection each, so both worker processes answer some
            status, headers, job = post_json(port, {"type": "echo", "payload": i})
            assert status == 201 and headers["Location"] == f"/api/v1/jobs/{job['id']}"
            ids.append(job["id"])
        ready = dispatcher.client.lrange(QueueKeys("default").ready(5), 0, -1)
        assert sorted(ready) == sorted(ids)
        assert all(store.get_job(i).status == "queued" for i in ids)

        status, _, body = post_json(port, {"type": "echo", "payload": "x" * 8192}, chunked=True)
        assert status == 413 and body["error"]["code"] == "payload_too_large"
        assert post_json(port, {"type": "echo"}, chunked=True)[0] == 201

        assert requests_counted(port, "/api/v1/jobs", 201) == 7
        stop_process(proc)
        assert proc.returncode == 0
