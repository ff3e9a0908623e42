"""Migration 0021 (partitioned history) applied under the previous release's running worker
and maintenance, then both releases side by side: every job runs exactly once, the previous
release's worker keeps fencing, settling and writing events through the same table names
(its new rows land in the new partitions), and the rows from before stay in the legacy one.

The previous release is the real code of the last commit before 0021 (head 0020), taken
from this repository's history as tests/integration/test_schema_move.py does. Judged from
the recorded history with the fault suite's per-job checks.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from taskline.settings import Settings
from taskline.store.migrate import upgrade
from taskline.store.partitions import WIDTH
from tests.faults import faulthandlers
from tests.helpers import stop_process, wait_for
from tests.integration.test_schema_move import (
    ENQUEUE,
    MAIN,
    PACKAGES,
    REPO,
    _assert_each_job_ran_once,
    _count,
    _env,
    _query,
    _run,
    _start,
    empty_database,  # noqa: F401 - a fixture
)

pytestmark = pytest.mark.slow

PREVIOUS = "107f15a"
"""The last commit before migration 0021: its schema head is 0020."""


@pytest.fixture(scope="module")
def previous_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An import path holding the previous release's packages, from git history."""
    if subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", PREVIOUS],
                      capture_output=True).returncode != 0:
        pytest.skip(f"commit {PREVIOUS} (the release before 0021) is not in this clone")
    root = tmp_path_factory.mktemp("previous")
    archive = subprocess.run(["git", "-C", str(REPO), "archive", PREVIOUS,
                              *set(PACKAGES.values())], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    path = root / "path"
    path.mkdir()
    for name, folder in PACKAGES.items():
        (path / name).symlink_to(root / folder)
    return path


def _succeeded(url: str) -> int:
    return _count(url, "SELECT count(*) AS n FROM taskline.jobs WHERE status = 'succeeded'")


def test_history_is_partitioned_under_the_running_previous_release(
        empty_database: str, redis_url: str, settings: Settings,  # noqa: F811
        previous_path: Path, tmp_path: Path):
    url = empty_database
    base = settings.replace(database_url=url, redis_url=redis_url)
    old_env, new_env = _env(base, previous_path), _env(base, None)
    _run(MAIN, ["migrate"], old_env)
    assert _query(url, "SELECT version_num AS v FROM taskline.alembic_version")[0]["v"] == "0020"
    faulthandlers.create_tables(url)
    old_worker = _start(["worker", "--concurrency", "4", "--metrics-port", "0"], old_env,
                        tmp_path / "old-worker.log")
    procs = [old_worker,
             _start(["maintenance", "--metrics-port", "0"], old_env, tmp_path / "old-maint.log")]
    try:
        _run(ENQUEUE, [url, "40", "0.3"], old_env)
        wait_for(lambda: _succeeded(url) >= 4, timeout=30,
                 message="the previous worker to finish some jobs")
        assert _count(url, "SELECT count(*) AS n FROM taskline.jobs WHERE status = 'running'") > 0
        upgrade(url, create=False)  # 0021, under the running previous release
        assert _query(url, "SELECT count(*) AS n FROM pg_partitioned_table WHERE partrelid IN "
                           "('taskline.job_events'::regclass, 'taskline.job_leases'::regclass)"
                      )[0]["n"] == 2
        _run(ENQUEUE, [url, "20", "0.1"], old_env)  # the previous library, after the swap
        wait_for(lambda: _count(url, f"SELECT count(*) AS n FROM taskline.job_leases WHERE "
                                     f"id >= {2 * WIDTH} AND worker_id LIKE "
                                     f"'%%-{old_worker.pid}-%%' AND released_at IS NOT NULL") > 0,
                 timeout=30, message="the previous worker to settle a lease of a new partition")
        _run(ENQUEUE, [url, "20", "0.1"], new_env)
        procs += [_start(["worker", "--concurrency", "4", "--metrics-port", "0"], new_env,
                         tmp_path / "new-worker.log"),
                  _start(["maintenance", "--metrics-port", "0"], new_env,
                         tmp_path / "new-maint.log")]
        wait_for(lambda: _succeeded(url) == 80, timeout=90, message="every job to succeed")
        stop_process(old_worker)  # the previous worker stops after the deploy, gracefully
        assert all(p.poll() is None for p in procs[1:]), "a service exited"
    finally:
        for proc in procs:
            stop_process(proc)
    _assert_each_job_ran_once(url)
    spread = _query(url, "SELECT (SELECT count(*) FROM taskline.job_events_legacy) AS legacy, "
                         "(SELECT count(*) FROM taskline.job_events WHERE id >= "
                         f"{2 * WIDTH}) AS partitioned, "
                         "(SELECT count(*) FROM taskline.job_events_default) AS spilled")[0]
    assert spread["legacy"] > 0 and spread["partitioned"] > 0 and spread["spilled"] == 0

