"""`taskline doctor` against real servers: each check passes on a sound setup and fails on the
mistake it is there for (a private Redis with allkeys-lru, autovacuum off on a private
PostgreSQL, this host's clock 30 s ahead through faketime, more connections than
max_connections, an unmigrated schema, an unhealthy Redis Cluster, a direct URL that does not
answer, servers that are down); one line per check, exit 1 on any failure, `--json`. The
services log what fails as warnings at start, without waiting for it.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis
from psycopg import sql

from taskline import doctor
from taskline.settings import Settings
from taskline.store.partitions import HistoryPartitions
from taskline.store.store import make_engine
from taskline_cli.localservers import PrivatePostgres, PrivateRedis
from tests.faults.clockskew import skewed_env
from tests.helpers import service, service_env, wait_for
from tests.servers import new_database, scratch_dir

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def run_doctor(settings: Settings, *args: str, env: dict[str, str] | None = None
               ) -> tuple[int, dict[str, dict], str]:
    """`taskline doctor --json` with `settings`: exit status, checks by name, and the text."""
    full = {**service_env(settings), **(env or {})}
    done = subprocess.run([sys.executable, "-m", "taskline_cli.main", "doctor", "--json", *args],
                          env=full, capture_output=True, text=True, timeout=60, cwd=REPO)
    report = json.loads(done.stdout)
    assert report["ok"] == (done.returncode == 0), done.stdout
    return done.returncode, {c["name"]: c for c in report["checks"]}, done.stdout


def status(checks: dict[str, dict], name: str) -> str:
    return checks[name]["status"]


@pytest.fixture
def sound(settings: Settings, private_postgres: PrivatePostgres,
          private_redis: PrivateRedis) -> Settings:
    """A setup every check passes: a private PostgreSQL (autovacuum on, as initdb makes it)
    with a migrated database, and a private Redis with noeviction."""
    return settings.replace(database_url=new_database(private_postgres),
                            redis_url=private_redis.url)


def test_a_sound_setup_passes_every_check_and_prints_one_line_each(sound: Settings) -> None:
    code, checks, _ = run_doctor(sound)
    assert code == 0
    assert {name: c["status"] for name, c in checks.items()} == {
        name: "ok" for name in ("postgres", "schema", "autovacuum", "history_partitions",
                                "clock", "connections", "session", "redis", "eviction",
                                "cluster", "queue_partitions")}
    assert checks["postgres"]["detail"].startswith("PostgreSQL ")
    assert checks["redis"]["detail"].startswith("Redis ")
    text = subprocess.run([sys.executable, "-m", "taskline_cli.main", "doctor"],
                          env=service_env(sound), capture_output=True, text=True, timeout=60,
                          cwd=REPO)
    assert text.returncode == 0
    lines = text.stdout.splitlines()
    assert len(lines) == len(checks) and all(line.startswith("ok") for line in lines)
    details = {re.match(r"\S+\s+\S+\s+", line).end() for line in lines}  # type: ignore[union-attr]
    assert len(details) == 1, ("every detail starts in one column", lines)


def test_an_evicting_redis_fails(sound: Settings, private_redis: PrivateRedis) -> None:
    with redis.Redis.from_url(private_redis.url) as client:
        client.config_set("maxmemory-policy", "allkeys-lru")
    try:
        code, checks, _ = run_doctor(sound)
    finally:
        with redis.Redis.from_url(private_redis.url) as client:
            client.config_set("maxmemory-policy", "noeviction")
    assert code == 1 and status(checks, "eviction") == "fail"
    assert "allkeys-lru" in checks["eviction"]["detail"]
    assert "noeviction" in checks["eviction"]["fix"]


@pytest.fixture
def autovacuum_off(private_postgres: PrivatePostgres) -> Iterator[None]:
    def set_autovacuum(value: str) -> None:
        with psycopg.connect(private_postgres.url(), autocommit=True) as conn:
            conn.execute(sql.SQL("ALTER SYSTEM SET autovacuum = {}").format(sql.Literal(value)))
            conn.execute("SELECT pg_reload_conf()")
            wait_for(lambda: conn.execute("SHOW autovacuum").fetchone()[0] == value,
                     message=f"autovacuum {value}")

    set_autovacuum("off")
    try:
        yield
    finally:
        set_autovacuum("on")


def test_autovacuum_off_fails(sound: Settings, autovacuum_off: None) -> None:
    code, checks, _ = run_doctor(sound)
    assert code == 1 and status(checks, "autovacuum") == "fail"
    assert [n for n, c in checks.items() if c["status"] != "ok"] == ["autovacuum"]


def test_a_clock_30_s_ahead_fails(sound: Settings, tmp_path: Path) -> None:
    code, checks, _ = run_doctor(sound, env=skewed_env("+30s", tmp_path))
    assert code == 1 and status(checks, "clock") == "fail"
    assert "ahead of" in checks["clock"]["detail"]


def test_more_connections_than_max_connections_fail(sound: Settings) -> None:
    code, checks, _ = run_doctor(sound, "--workers", "10", "--concurrency", "32")
    assert code == 1 and status(checks, "connections") == "fail"
    assert "max_connections 100" in checks["connections"]["detail"]
    # Behind a transaction pooler only the sessions count against PostgreSQL.
    pooled = sound.replace(database_pooling="transaction",
                           database_direct_url=sound.database_url)
    code, checks, _ = run_doctor(pooled, "--workers", "10", "--concurrency", "32")
    assert status(checks, "connections") == "ok", checks["connections"]


def test_an_unmigrated_schema_fails(sound: Settings, private_postgres: PrivatePostgres) -> None:
    name = f"empty_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(private_postgres.url(), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    code, checks, _ = run_doctor(sound.replace(database_url=private_postgres.url(name)))
    assert code == 1 and status(checks, "schema") == "fail"
    assert "taskline migrate" in checks["schema"]["fix"]
    code, checks, _ = run_doctor(sound.replace(schema="elsewhere"))
    assert status(checks, "schema") == "fail"


def test_servers_that_are_down_fail_and_skip_what_needs_them(settings: Settings) -> None:
    down = settings.replace(database_url=f"postgresql://root@127.0.0.1:{_closed_port()}/x",
                            redis_url=f"redis://127.0.0.1:{_closed_port()}/0")
    code, checks, _ = run_doctor(down)
    assert code == 1
    assert status(checks, "postgres") == "fail" and status(checks, "redis") == "fail"
    assert {status(checks, n) for n in ("schema", "autovacuum", "clock", "connections",
                                         "eviction", "cluster", "history_partitions",
                                         "queue_partitions")} == {"skip"}


def test_a_direct_url_that_does_not_answer_fails(sound: Settings) -> None:
    pooled = sound.replace(database_pooling="transaction",
                           database_direct_url=f"postgresql://root@127.0.0.1:{_closed_port()}/x")
    code, checks, _ = run_doctor(pooled)
    assert code == 1 and status(checks, "session") == "fail"
    code, checks, _ = run_doctor(pooled.replace(database_direct_url=""))
    assert code == 0 and status(checks, "session") == "warn"


class ClusterRedis(PrivateRedis):
    """A one-node Redis Cluster that owns no hash slot yet: its state is `fail`."""

    def _argv(self) -> list[str]:
        return [*super()._argv(), "--cluster-enabled", "yes",
                "--cluster-config-file", str(self.workdir / "nodes.conf")]


def test_an_unhealthy_redis_cluster_fails(sound: Settings) -> None:
    with scratch_dir("taskline-cluster-") as root:
        server = ClusterRedis(root / "redis")
        try:
            server.start()
            code, checks, _ = run_doctor(sound.replace(redis_url=server.url))
        finally:
            server.close()
    assert code == 1 and status(checks, "cluster") == "fail"
    assert "state fail" in checks["cluster"]["detail"]


def test_a_worker_logs_what_fails_as_warnings(sound: Settings, private_redis: PrivateRedis,
                                              tmp_path: Path) -> None:
    with redis.Redis.from_url(private_redis.url) as client:
        client.config_set("maxmemory-policy", "allkeys-lru")
    try:
        with service(["worker", "--concurrency", "2"], service_env(sound), tmp_path):
            wait_for(lambda: '"check":"eviction"' in _logs(tmp_path), timeout=20,
                     message="the doctor's warning in the worker's log")
    finally:
        with redis.Redis.from_url(private_redis.url) as client:
            client.config_set("maxmemory-policy", "noeviction")
    warned = [json.loads(line) for line in _logs(tmp_path).splitlines()
              if '"action":"doctor"' in line]
    assert [(r["level"], r["check"]) for r in warned] == [("warning", "eviction")]


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def doctor_records() -> Iterator[Records]:
    """The doctor's log records, whatever an earlier test made of logging's configuration."""
    logger, handler = logging.getLogger("taskline.doctor"), Records()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_the_start_waits_for_no_check(settings: Settings, doctor_records: Records,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Servers that never answer (a listening socket nobody serves) cost the caller nothing."""
    monkeypatch.setattr(doctor, "TIMEOUT_S", 1)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        slow = settings.replace(database_url=f"postgresql://root@127.0.0.1:{port}/x",
                                redis_url=f"redis://127.0.0.1:{port}/0")
        started = time.monotonic()
        thread = doctor.warn_at_start(slow, doctor.Plan())
        assert time.monotonic() - started < 0.1
        thread.join(2 * doctor.TIMEOUT_S + 5)
    assert not thread.is_alive()
    assert {r.check for r in doctor_records.records} >= {"postgres", "redis"}


def _logs(folder: Path) -> str:
    return "".join(p.read_text() for p in folder.glob("*.log"))


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_history_partitions_missing_ahead_fail_until_maintenance_creates_them(
        sound: Settings) -> None:
    """Migration 0021's partitions ahead, dropped: the next roll would have nowhere to go."""
    engine = make_engine(sound.database_url)
    parts = HistoryPartitions(engine, sound.schema)
    try:
        with engine.begin() as conn:
            for table in ("job_events", "job_leases"):
                nxt = parts.next_id(conn, table)
                for part in parts.list(conn, table):
                    if part.lower is not None and part.lower > nxt:
                        conn.exec_driver_sql(f"DROP TABLE taskline.{part.name}")
        code, checks, _ = run_doctor(sound)
        assert code == 1 and status(checks, "history_partitions") == "fail", \
            checks["history_partitions"]
        parts.ensure_ahead(sound.history_partitions_ahead)
        code, checks, _ = run_doctor(sound)
        assert status(checks, "history_partitions") == "ok", checks["history_partitions"]
    finally:
        engine.dispose()
