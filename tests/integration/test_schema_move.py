"""Moving a running installation out of `public` into its schema, with the earlier release's
processes working through the move (taskline.store.relocation, docs/deployment.md).

The earlier release is the real code of the last commit that kept every object in `public`,
taken from this repository's history: its `taskline migrate`, its worker and maintenance run
from that tree, its library enqueues through its own unqualified SQL. Judged from the recorded
history (job_events, job_leases, the fault handlers' execution log and effects) with the fault
suite's own per-job checks.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.rows import dict_row

from taskline.settings import Settings
from taskline.store.migrate import upgrade
from tests.conftest import db_url
from tests.faults import faulthandlers
from tests.faults.checker import Snapshot, _grouped, dlq_violations, job_violations
from tests.helpers import service_env, stop_process, wait_for

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
LEGACY = "6cf61a3"
"""The last commit whose `taskline migrate` wrote every object into `public`."""
PACKAGES = {"taskline": "shared/taskline", "taskline_producer": "services/producer",
            "taskline_worker": "services/worker", "taskline_maintenance": "services/maintenance",
            "taskline_cli": "services/cli", "taskline_migrations": "migrations"}
MAIN = "import sys; from taskline_cli.main import main; sys.exit(main(sys.argv[1:]))"
ENQUEUE = """
import sys, sqlalchemy, taskline
engine = sqlalchemy.create_engine(sys.argv[1].replace("postgresql://", "postgresql+psycopg://"))
with engine.begin() as conn:
    for i in range(int(sys.argv[2])):
        taskline.enqueue(conn, "fault.work", {"sleep_s": float(sys.argv[3])})
"""


@pytest.fixture(scope="module")
def legacy_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An import path holding the earlier release's packages, from git history."""
    if subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", LEGACY],
                      capture_output=True).returncode != 0:
        pytest.skip(f"commit {LEGACY} (the release before the schema setting) is not in this "
                    "clone's history")
    root = tmp_path_factory.mktemp("legacy")
    archive = subprocess.run(["git", "-C", str(REPO), "archive", LEGACY, *set(PACKAGES.values())],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    path = root / "path"
    path.mkdir()
    for name, folder in PACKAGES.items():
        (path / name).symlink_to(root / folder)
    return path


@pytest.fixture
def empty_database() -> Iterator[str]:
    name = f"taskline_move_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(db_url("postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield db_url(name)
    with psycopg.connect(db_url("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _env(settings: Settings, legacy: Path | None) -> dict[str, str]:
    env = service_env(settings.replace(handlers=("tests.faults.faulthandlers",)),
                      FAULT_LOG_DATABASE_URL=settings.database_url)
    env["PYTHONPATH"] = os.pathsep.join([str(legacy)] * (legacy is not None) + [str(REPO)])
    return env


def _start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", MAIN, *args], env=env, cwd=log.parent,
                            stdout=log.open("wb"), stderr=subprocess.STDOUT)


def _run(code: str, args: list[str], env: dict[str, str]) -> None:
    subprocess.run([sys.executable, "-c", code, *args], env=env, check=True, timeout=60)


def _query(url: str, sql: str, params: tuple = ()) -> list[dict]:
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        return conn.execute(sql, params).fetchall()


def _count(url: str, sql: str) -> int:
    return int(_query(url, sql)[0]["n"])


def test_a_running_installation_moves_into_its_schema_and_every_job_runs_once(
        empty_database: str, redis_url: str, settings: Settings, legacy_path: Path,
        tmp_path: Path):
    url = empty_database
    base = settings.replace(database_url=url, redis_url=redis_url)
    old_env, new_env = _env(base, legacy_path), _env(base, None)
    _run(MAIN, ["migrate"], old_env)
    assert _count(url, "SELECT count(*) AS n FROM public.jobs") == 0  # the earlier layout
    faulthandlers.create_tables(url)
    procs = [_start(["worker", "--concurrency", "4", "--metrics-port", "0"], old_env,
                    tmp_path / "old-worker.log"),
             _start(["maintenance", "--metrics-port", "0"], old_env, tmp_path / "old-maint.log")]
    try:
        _run(ENQUEUE, [url, "40", "0.3"], old_env)
        wait_for(lambda: _count(url, "SELECT count(*) AS n FROM public.jobs "
                                     "WHERE status = 'succeeded'") >= 4,
                 timeout=30, message="the earlier worker to finish some jobs")
        assert _count(url, "SELECT count(*) AS n FROM public.jobs WHERE status = 'running'") > 0
        upgrade(url, create=False)  # the move, under the running earlier release
        assert _query(url, "SELECT relkind AS k FROM pg_class "
                           "WHERE oid = 'public.jobs'::regclass")[0]["k"] == "v"
        _run(ENQUEUE, [url, "20", "0.1"], old_env)  # the earlier library, through the views
        _run(ENQUEUE, [url, "20", "0.1"], new_env)  # this release's library, in the schema
        procs += [_start(["worker", "--concurrency", "4", "--metrics-port", "0"], new_env,
                         tmp_path / "new-worker.log"),
                  _start(["maintenance", "--metrics-port", "0"], new_env,
                         tmp_path / "new-maint.log")]
        wait_for(lambda: _count(url, "SELECT count(*) AS n FROM taskline.jobs "
                                     "WHERE status = 'succeeded'") == 80,
                 timeout=60, message="every job to succeed")
        stop_process(procs[0])  # the earlier worker stops after the move, gracefully
        assert all(p.poll() is None for p in procs[1:]), "a service exited"
    finally:
        for proc in procs:
            stop_process(proc)
    _assert_each_job_ran_once(url)
    _finish_move(url, new_env)


def _assert_each_job_ran_once(url: str) -> None:
    snap = Snapshot(
        jobs={str(r["id"]): r for r in _query(
            url, "SELECT id, type, queue, status, attempts, max_retries, updated_at, limit_key "
                 "FROM taskline.jobs")},
        events=_grouped(_query(url, "SELECT job_id, id, attempt, event, detail, created_at "
                                    "FROM taskline.job_events ORDER BY id")),
        leases=_grouped(_query(url, "SELECT job_id, id, attempt, worker_id, leased_at, "
                                    "leased_until, released_at, outcome "
                                    "FROM taskline.job_leases ORDER BY id")),
        execs=_grouped(_query(url, "SELECT job_id, id, attempt, worker_id, pid, started_at, "
                                   "ended_at FROM fault_exec_log ORDER BY id")),
        effects=_grouped(_query(url, "SELECT job_id, attempt, worker_id FROM fault_effects")),
        dead_letters={})
    assert len(snap.jobs) == 80
    violations = [f"{j}: {v}" for j in snap.jobs for v in job_violations(j, snap)]
    assert violations + dlq_violations(snap) == []
    assert {j: len(snap.effects.get(j, [])) for j in snap.jobs} == {j: 1 for j in snap.jobs}
    assert {r["status"] for r in snap.jobs.values()} == {"succeeded"}


def _finish_move(url: str, env: dict[str, str]) -> None:
    out = subprocess.run([sys.executable, "-c", MAIN, "migrate", "--finish-move"], env=env,
                         capture_output=True, text=True, check=True, timeout=60).stdout
    assert "dropped 18 compatibility views in public" in out
    left = _query(url, "SELECT c.relname FROM pg_class c JOIN pg_namespace n "
                       "ON n.oid = c.relnamespace WHERE n.nspname = 'public' "
                       "AND c.relname NOT LIKE 'fault\\_%%'")
    assert left == []  # the suite's own fault tables are all that stays in public
    assert _query(url, "SELECT version_num FROM taskline.alembic_version") != []
