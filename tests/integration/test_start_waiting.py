"""Worker and maintenance started before PostgreSQL answers, as real `taskline` processes
against a private PostgreSQL that is down at their start: they wait (saying for what and why,
with the driver's message), answer 503 on `/readyz` of their metrics port meanwhile, start
working once the server is up, and a SIGTERM during the wait ends them at once with status 0.
Also: a loop's failed pass logs the driver's own message, without the password.
"""

from __future__ import annotations

import json
import logging
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from taskline.dispatch.dispatcher import Dispatcher
from taskline.service import guarded
from taskline.settings import Settings
from taskline.store.store import Store
from taskline_cli.localservers import PrivatePostgres, free_port
from tests.helpers import enqueue, service, service_env, wait_for

READY_TIMEOUT_S = 30.0


def readyz(port: int) -> tuple[int, dict] | None:
    """(status, JSON body) of /readyz on a metrics port; None while nothing answers."""
    try:
        answer = requests.get(f"http://127.0.0.1:{port}/readyz", timeout=2)
    except requests.RequestException:
        return None
    try:
        return answer.status_code, answer.json()
    except ValueError:
        return answer.status_code, {"not json": answer.text[:200]}


def records(log_dir: Path, kind: str) -> list[dict]:
    """The JSON log records of the `kind` service logged into `log_dir`."""
    found = []
    for path in log_dir.glob(f"{kind}-*.log"):
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                found.append(json.loads(line))
    return found


def waiting_records(log_dir: Path, kind: str) -> list[dict]:
    return [r for r in records(log_dir, kind)
            if r.get("action") == "wait" and r.get("server") == "PostgreSQL"
            and "failed_attempts" in r and "error" in r]


def assert_waits_for_postgresql(proc, port: int, log_dir: Path, kind: str) -> None:
    """The process is alive, says it waits for PostgreSQL and why, and is not ready."""
    def logged() -> list[dict]:
        assert proc.poll() is None, f"the {kind} exited with {proc.returncode}"
        return waiting_records(log_dir, kind)
    wait_for(logged, timeout=READY_TIMEOUT_S,
             message=f"the {kind} to log that it waits for PostgreSQL")
    first = waiting_records(log_dir, kind)[0]
    # The driver's own words, not only "PostgreSQL unavailable: OperationalError".
    assert "Connection refused" in first["error"], first
    answer = wait_for(lambda: readyz(port), message="/readyz to answer")
    assert answer[0] == 503, answer
    assert answer[1]["status"] == "waiting" and answer[1]["waiting_for"] == "PostgreSQL"
    time.sleep(1.0)  # a few more attempts: still waiting, not gone
    assert proc.poll() is None, f"the {kind} exited with {proc.returncode} while waiting"


def assert_stops_cleanly(proc) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0


@pytest.fixture
def down_postgres(private_settings: Settings, private_postgres: PrivatePostgres
                  ) -> Iterator[PrivatePostgres]:
    """The private PostgreSQL of `private_settings`, stopped (its database and schema made)."""
    private_postgres.stop()
    yield private_postgres
    private_postgres.start()


def test_a_worker_started_before_postgresql_waits_then_runs_jobs(
        private_settings: Settings, down_postgres: PrivatePostgres, tmp_path: Path) -> None:
    port = free_port()
    with service(["worker", "--metrics-port", str(port), "--concurrency", "2"],
                 service_env(private_settings), tmp_path) as proc:
        assert_waits_for_postgresql(proc, port, tmp_path, "worker")
        down_postgres.start()
        wait_for(lambda: (readyz(port) or (0,))[0] == 200, timeout=READY_TIMEOUT_S,
                 message="the worker to be ready once PostgreSQL answers")
        store = Store.connect(private_settings.database_url, pool_size=2)
        dispatcher = Dispatcher(private_settings.redis_url)
        try:
            job = enqueue(store, dispatcher, "echo", {"after": "the wait"})
            wait_for(lambda: store.get_job(job.id).status.value == "succeeded",
                     timeout=READY_TIMEOUT_S, message="the job to run")
        finally:
            store.dispose()
            dispatcher.close()
        assert_stops_cleanly(proc)
    assert any(r.get("msg") == "PostgreSQL answers: starting"
               for r in records(tmp_path, "worker"))


def test_maintenance_started_before_postgresql_waits_then_leads(
        private_settings: Settings, down_postgres: PrivatePostgres, tmp_path: Path) -> None:
    port = free_port()
    with service(["maintenance", "--metrics-port", str(port)], service_env(private_settings),
                 tmp_path) as proc:
        assert_waits_for_postgresql(proc, port, tmp_path, "maintenance")
        # Nothing ran meanwhile: no component logged a failed pass.
        assert not [r for r in records(tmp_path, "maintenance")
                    if "pass failed" in r.get("msg", "")]
        down_postgres.start()
        wait_for(lambda: (readyz(port) or (0,))[0] == 200, timeout=READY_TIMEOUT_S,
                 message="maintenance to be ready once PostgreSQL answers")
        wait_for(lambda: any(r.get("msg") == "maintenance leadership taken"
                             for r in records(tmp_path, "maintenance")),
                 timeout=READY_TIMEOUT_S, message="maintenance to lead")
        assert_stops_cleanly(proc)


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port that accepts TCP connections and never answers: every connection attempt of
    a client hangs until its own timeout (a server that is starting, or a blackhole)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield sock.getsockname()[1]


@pytest.mark.parametrize("kind", ["worker", "maintenance"])
def test_sigterm_while_waiting_for_postgresql_exits_at_once(
        settings: Settings, silent_server: int, tmp_path: Path, kind: str) -> None:
    hanging = settings.replace(
        database_url=f"postgresql://taskline:hunter2@127.0.0.1:{silent_server}/taskline")
    port = free_port()
    with service([kind, "--metrics-port", str(port)], service_env(hanging), tmp_path) as proc:
        answer = wait_for(lambda: readyz(port), timeout=READY_TIMEOUT_S,
                          message="/readyz to answer")
        assert answer[0] == 503, answer
        time.sleep(1.0)  # inside its first attempt, which hangs in the connect
        assert proc.poll() is None
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert time.monotonic() - sent < 2.0, "a SIGTERM must not wait for the attempt"
    logs = "".join(p.read_text() for p in tmp_path.glob("*.log"))
    assert "hunter2" not in logs


def test_a_failed_pass_logs_the_drivers_message_without_the_password(
        caplog: pytest.LogCaptureFixture) -> None:
    closed = free_port()
    store = Store.connect(f"postgresql://taskline:hunter2@127.0.0.1:{closed}/taskline")
    dispatcher = Dispatcher(f"redis://:hunter2@127.0.0.1:{closed}/0")
    try:
        with caplog.at_level(logging.ERROR, logger="taskline.service"):
            assert guarded("probe-postgresql", store.ping) == (False, None)
            assert guarded("probe-redis", dispatcher.ping) == (False, None)
    finally:
        store.dispose()
        dispatcher.close()
    postgresql, redis = (r.getMessage() for r in caplog.records)
    assert postgresql.startswith("probe-postgresql pass failed: PostgreSQL unavailable")
    assert "Connection refused" in postgresql and f"port {closed}" in postgresql
    assert redis.startswith("probe-redis pass failed: Redis unavailable")
    assert "Connection refused" in redis
    assert "hunter2" not in postgresql + redis
