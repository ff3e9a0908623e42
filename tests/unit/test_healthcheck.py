"""deploy/healthcheck.py, the image's HEALTHCHECK: it finds which service a container runs from
its command line, probes that service's endpoint (api /healthz, worker and maintenance /metrics)
over loopback, and passes only on a 200; one-shot commands have nothing to probe."""

from __future__ import annotations

import http.server
import importlib.util
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "healthcheck.py"


@pytest.fixture(scope="module")
def hc() -> ModuleType:
    spec = importlib.util.spec_from_file_location("healthcheck", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("argv", [
    ["/opt/venv/bin/python", "/opt/venv/bin/taskline", "worker", "--concurrency", "4"],
    ["/sbin/docker-init", "--", "taskline", "worker", "--concurrency", "4"],
    # The worker re-executes itself this way when it recycles.
    ["/opt/venv/bin/python", "-m", "taskline_cli.main", "worker", "--concurrency", "4"],
])
def test_the_service_is_read_from_any_form_of_the_command_line(hc, argv):
    assert hc.service_command(argv) == ["worker", "--concurrency", "4"]


def test_a_foreign_command_line_has_no_service(hc):
    assert hc.service_command(["/bin/sh", "-c", "sleep 1"]) == []


@pytest.mark.parametrize(("args", "env", "url"), [
    (["api"], {}, "http://127.0.0.1:8000/healthz"),
    (["api", "--bind", "0.0.0.0:8080"], {}, "http://127.0.0.1:8080/healthz"),
    (["api", "--bind=[::]:8081"], {}, "http://127.0.0.1:8081/healthz"),
    (["api", "--bind", "10.1.2.3:8082"], {}, "http://10.1.2.3:8082/healthz"),
    (["worker"], {}, "http://127.0.0.1:9100/metrics"),
    (["worker"], {"TASKLINE_METRICS_PORT": "9200"}, "http://127.0.0.1:9200/metrics"),
    (["maintenance", "--metrics-port", "9300"], {"TASKLINE_METRICS_PORT": "9200"},
     "http://127.0.0.1:9300/metrics"),
    (["worker", "--metrics-port", "0"], {}, None),
    (["migrate"], {}, None),
    ([], {}, None),
])
def test_each_service_is_probed_where_it_answers(hc, args, env, url):
    assert hc.probe_url(args, env) == url


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path in ("/healthz", "/metrics") else 500)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def server() -> Iterator[int]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()


def _run(*command: str) -> int:
    return subprocess.run([sys.executable, str(SCRIPT), *command], capture_output=True,
                          timeout=20).returncode


def test_a_live_service_passes(server: int):
    assert _run("taskline", "worker", "--metrics-port", str(server)) == 0
    assert _run("taskline", "api", "--bind", f"127.0.0.1:{server}") == 0


@pytest.fixture()
def closed_port() -> Iterator[int]:
    """A loopback port bound but not listening, so connections to it are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def test_a_silent_or_failing_service_fails(hc, server: int, closed_port: int):
    assert _run("taskline", "maintenance", "--metrics-port", str(closed_port)) == 1
    # Only a 200 passes: the test server answers 500 on any other path.
    assert hc.check(f"http://127.0.0.1:{server}/healthz") is True
    assert hc.check(f"http://127.0.0.1:{server}/other") is False


def test_a_one_shot_command_passes():
    assert _run("taskline", "migrate") == 0
