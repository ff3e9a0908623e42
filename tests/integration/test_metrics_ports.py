"""Several worker and maintenance processes on one host, started without `--metrics-port`.

The default metrics port (TASKLINE_METRICS_PORT) is held by the test, as another process on the
host would hold it: three workers and two maintenance processes started without a port all run,
each serving /metrics and /readyz on a port of its own past the default, logged, and each
worker's port is shown as `metrics_port` by GET /api/v1/workers. A `--metrics-port` given and
taken stays an error. `--handlers` is TASKLINE_HANDLERS on the command line.
"""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
import requests

from taskline.dispatch.dispatcher import Dispatcher
from taskline.settings import Settings
from taskline.store.store import Store
from taskline_cli.localservers import free_port
from tests.helpers import enqueue, service, service_env, wait_for

pytestmark = pytest.mark.slow


@contextmanager
def held_port() -> Iterator[int]:
    """A port some other process listens on, as a metrics port of the host's first service."""
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", free_port()))
        sock.listen()
        yield sock.getsockname()[1]


def logged_ports(log_dir: Path, service_name: str) -> list[int]:
    """The metrics ports `service_name`'s processes logged, in no order."""
    ports = []
    for path in log_dir.glob(f"{service_name}-*.log"):
        for line in path.read_text().splitlines():
            record = json.loads(line) if line.startswith("{") else {}
            if "serving /metrics" in record.get("msg", ""):
                ports.append(record["port"])
    return ports


def ready(port: int) -> bool:
    try:
        return requests.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def test_three_workers_and_two_maintenance_on_one_host(settings: Settings, store: Store,
                                                       dispatcher: Dispatcher, client,
                                                       tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    with held_port() as default, ExitStack() as stack:
        env = service_env(settings, TASKLINE_METRICS_PORT=str(default), TASKLINE_HANDLERS="")
        procs = [stack.enter_context(service(["worker", "--queues", "ports", "--handlers",
                                              "tests.integration.worker_handlers"], env, logs))]
        procs += [stack.enter_context(service(["worker", "--concurrency", "2"], env, logs))
                  for _ in range(2)]
        procs += [stack.enter_context(service(["maintenance"], env, logs)) for _ in range(2)]

        workers = wait_for(lambda: len(store.list_workers(30)) == 3 and store.list_workers(30),
                           timeout=60, message="three workers registered")
        wait_for(lambda: len(logged_ports(logs, "maintenance")) == 2, timeout=60,
                 message="both maintenance processes serving metrics")
        assert [p.poll() for p in procs] == [None] * 5, f"a process exited; see {logs}"

        ports = [w["metrics_port"] for w in workers] + logged_ports(logs, "maintenance")
        assert len(set(ports)) == 5 and default not in ports
        assert all(default < port <= default + 100 for port in ports)
        assert sorted(logged_ports(logs, "worker")) == sorted(w["metrics_port"] for w in workers)
        for port in ports:
            wait_for(lambda p=port: ready(p), timeout=30, message=f"/readyz on {port}")

        listed = client.get("/api/v1/workers").get_json()["workers"]
        assert sorted(w["metrics_port"] for w in listed) == sorted(ports[:3])

        job = enqueue(store, dispatcher, "t.held", {"sleep_s": 0}, queue="ports")
        wait_for(lambda: store.get_job(job.id).status == "succeeded", timeout=30,
                 message="the job of a --handlers module run")


def test_a_given_metrics_port_that_is_taken_is_an_error(settings: Settings,
                                                        tmp_path: Path) -> None:
    with held_port() as taken:
        with service(["worker", "--metrics-port", str(taken)], service_env(settings),
                     tmp_path) as proc:
            try:
                assert proc.wait(timeout=60) == 2
            except subprocess.TimeoutExpired:
                pytest.fail("the worker ran on a taken --metrics-port")
        with service(["maintenance", "--metrics-port", str(taken)], service_env(settings),
                     tmp_path) as proc:
            assert proc.wait(timeout=60) == 2
    log = "".join(p.read_text() for p in tmp_path.glob("*.log"))
    assert log.count("cannot serve /metrics") == 2


def test_worker_help_names_the_handler_modules() -> None:
    from taskline_cli.main import build_parser

    help_text = build_parser()._subparsers._group_actions[0].choices["worker"].format_help()
    assert "TASKLINE_HANDLERS" in help_text and "--handlers" in help_text
    args = build_parser().parse_args(["worker", "--handlers", "app.jobs, app.mail"])
    assert args.handlers == ["app.jobs", "app.mail"]
