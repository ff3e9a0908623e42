"""The whole stack behind a transaction-pooling PgBouncer (tests/pgbouncer.py: Debian's package,
two server connections per database), with producers enqueuing through the API while workers
drain a backlog, and PgBouncer restarted (and once killed) mid-drain. Every service reaches
PostgreSQL through PgBouncer with TASKLINE_DATABASE_POOLING=transaction, and the direct URL
for its LISTEN (or, in the second scenario, no direct URL: wake-ups poll). The checker reads
PostgreSQL directly.

Invariant under test: a pooler's restart cuts every client connection at once, which costs
availability for a moment (503 with Retry-After, a worker's renewals failing), never an
acknowledged job, a second lease of one attempt, or a job left behind.
"""

from __future__ import annotations

import pytest

from tests.faults.cluster import KINDS
from tests.faults.workload import Answer
from tests.helpers import wait_for
from tests.pgbouncer import PrivatePgBouncer, running_pgbouncer

pytestmark = pytest.mark.faults

WORK = "fault.work"
BACKLOG = 300


def acked(answers: list[Answer]) -> int:
    return sum(1 for a in list(answers) if a.ok)


def behind(run, bouncer: PrivatePgBouncer, direct: bool) -> None:
    """Point every service of `run` at PostgreSQL through `bouncer` (before they start)."""
    env = {"DATABASE_URL": bouncer.url(run.cluster.settings.database_url),
           "TASKLINE_DATABASE_POOLING": "transaction",
           "TASKLINE_DATABASE_DIRECT_URL": run.cluster.settings.database_url if direct else ""}
    for kind in KINDS:
        run.cluster.extra_env.setdefault(kind, {}).update(env)


def succeeded(run) -> int:
    return run.cluster.query("SELECT count(*) FROM taskline.jobs "
                             "WHERE status = 'succeeded'")[0][0]


def restart_mid_drain(run, bouncer: PrivatePgBouncer, answers: list[Answer], *,
                      kill: bool) -> None:
    """Once the drain is under way, stop PgBouncer (SIGTERM, or SIGKILL when `kill`) and
    start it again on its port; then wait until work and enqueues go on."""
    wait_for(lambda: succeeded(run) >= 30, timeout=60, interval=0.1,
             message="the drain to be under way")
    run.nemesis.fault("sigkill" if kill else "restart", "pgbouncer", pid=bouncer.pid)
    if kill:
        bouncer.kill()
    else:
        bouncer.stop()
    bouncer.start(timeout=20)
    run.nemesis.heal("start", "pgbouncer", pid=bouncer.pid)
    done, sent = succeeded(run), acked(answers)
    wait_for(lambda: succeeded(run) >= done + 30 and acked(answers) >= sent + 10, timeout=60,
             interval=0.1, message="jobs to run and enqueues to be accepted again")


def assert_ran_once(run, result) -> None:
    run.assert_clean(result)
    assert result.count("lost") == 0 and result.count("duplicated") == 0
    assert result.acknowledged >= BACKLOG


def scenario(fault_run, name: str, *, direct: bool, kill: bool):
    run = fault_run(name, start=False, workers=2, concurrency=4)
    with running_pgbouncer(run.cluster.postgres.port,
                           users=(run.cluster.postgres.superuser,)) as bouncer:
        behind(run, bouncer, direct)
        run.start()
        backlog = run.workload.many(
            [lambda: run.workload.enqueue(WORK, {"sleep_s": 0.02})] * BACKLOG)
        assert all(a.ok for a in backlog), [(a.status, a.body) for a in backlog if not a.ok]
        with run.workload.background(lambda i: run.workload.enqueue(WORK, {"sleep_s": 0.02}),
                                     threads=2, limit=400) as answers:
            restart_mid_drain(run, bouncer, answers, kill=kill)
        result = run.check(wait_s=90)
        run.cluster.close()  # the services stop before the PgBouncer they go through
    return run, result


@pytest.mark.fast
@pytest.mark.timeout(240)
def test_pgbouncer_restarted_mid_drain(fault_run):
    run, result = scenario(fault_run, "PgBouncer (transaction pooling) restarted mid-drain",
                           direct=True, kill=False)
    assert_ran_once(run, result)


@pytest.mark.timeout(240)
def test_pgbouncer_killed_mid_drain_without_a_direct_url(fault_run):
    run, result = scenario(fault_run, "PgBouncer SIGKILL mid-drain, no direct URL (polling)",
                           direct=False, kill=True)
    assert_ran_once(run, result)
