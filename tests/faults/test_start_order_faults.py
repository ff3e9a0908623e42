"""Start order: every service (api, maintenance, workers) started while PostgreSQL, or Redis,
is down, the server coming up only later, as after a host reboot or a compose start that brings
the database up after the services. Each scenario runs a real cluster on fresh servers with
producers enqueuing through the API, and is judged by the offline checker.

Invariant under test: no service exits for a server that is not there yet. Without PostgreSQL,
worker and maintenance wait for it (the API answers 503 meanwhile) and start working when it
comes; without Redis, everything starts and work goes on from PostgreSQL. Either way every
acknowledged job runs exactly once.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from tests.faults.workload import Answer
from tests.helpers import wait_for

pytestmark = pytest.mark.faults

WORK = "fault.work"
LOAD_LIMIT = 200
"""Enqueues `load` sends at most."""
DOWN_S = 4.0
"""How long the server stays down after the services started, seconds."""
REBUILD_WAIT_S = 30.0
"""Longest wait for maintenance's rebuild of a Redis that came back, seconds: it starts once
Redis has answered for SETTLE_S (1 s), at the rebuilder's next look (every 0.25 s)."""


def acked(answers: list[Answer]) -> int:
    return sum(1 for a in list(answers) if a.ok)


def wait_acked(answers: list[Answer], n: int, timeout: float = 60.0) -> None:
    wait_for(lambda: acked(answers) >= n, timeout=timeout, interval=0.05,
             message=f"{n} acknowledged enqueues")


def load(run):
    """Two producer threads enqueuing short fault.work jobs until the block ends (bounded)."""
    return run.workload.background(
        lambda i: run.workload.enqueue(WORK, {"sleep_s": 0.05}), threads=2, limit=LOAD_LIMIT)


def assert_all_alive(run) -> None:
    """No service exited: each still runs its first process."""
    gone = {s.name: s.proc.returncode for s in run.cluster.services if not s.alive}
    assert gone == {}, f"services exited: {gone} (logs in {run.cluster.workdir})"
    assert all(s.starts == 1 for s in run.cluster.services)


def waiting_for_postgresql(run, kind: str) -> list[dict]:
    return [r for r in run.cluster.log_events((kind,))
            if r.get("action") == "wait" and r.get("server") == "PostgreSQL"]


def assert_ran_once(run, result) -> None:
    """Every acknowledged job succeeded, each executed exactly once."""
    run.assert_clean(result)
    assert result.count("lost") == 0 and result.count("duplicated") == 0
    executions = Counter(job_id for (job_id,) in run.cluster.query(
        "SELECT job_id::text FROM fault_exec_log"))
    assert set(result.classes) <= set(executions)
    twice = {job_id: n for job_id, n in executions.items() if n > 1}
    assert twice == {}, f"jobs executed more than once: {twice}"


@pytest.mark.timeout(180)
def test_all_services_started_before_postgresql(fault_run):
    run = fault_run("all services started before PostgreSQL", workers=2, concurrency=4,
                    start=False)
    run.nemesis.stop_postgres()
    run.start(wait=False)
    for kind in ("worker", "maintenance"):
        wait_for(lambda k=kind: len(waiting_for_postgresql(run, k)) >= run.cluster.plan[k],
                 timeout=30, interval=0.1, message=f"every {kind} to wait for PostgreSQL")
    with load(run) as answers:
        time.sleep(DOWN_S)  # the producers are refused meanwhile (503) and retry
        assert_all_alive(run)
        assert acked(answers) == 0
        run.nemesis.start_postgres()
        run.cluster.wait_ready()
        wait_acked(answers, 60)
    result = run.check(wait_s=90)
    assert_ran_once(run, result)
    assert result.acknowledged >= 60
    assert_all_alive(run)
    answered = [r["status"] for r in run.history.entries("request") if r["status"]]
    assert 503 in answered and 500 not in answered


@pytest.mark.timeout(180)
def test_all_services_started_before_redis(fault_run):
    run = fault_run("all services started before Redis", workers=2, concurrency=4,
                    start=False)
    run.nemesis.kill_redis()
    run.start(wait=True)  # PostgreSQL is all that accepting and running jobs needs
    with load(run) as answers:
        wait_acked(answers, 30)  # accepted and run from PostgreSQL while Redis is down
        assert_all_alive(run)
        run.nemesis.start_redis()
        back_at = acked(answers)
        wait_acked(answers, back_at + 30)
    result = run.check(wait_s=90)
    assert_ran_once(run, result)
    assert_all_alive(run)
    # Maintenance said why Redis failed, in the driver's words; the workers claimed from
    # PostgreSQL first, and Redis was rebuilt once it came. The rebuild waits until Redis has
    # answered for SETTLE_S (every breaker closed): the 30 enqueues after the start may all be
    # answered and run before that, so it is waited for, not expected done.
    assert [r for r in run.cluster.log_events(("maintenance",))
            if "Connection refused" in r.get("msg", "")]
    assert [r for r in run.cluster.log_events(("worker",)) if r.get("mode") == "postgres"]
    wait_for(lambda: [r for r in run.cluster.log_events(("maintenance",))
                      if r.get("action") == "rebuild" and "missing" in r],
             timeout=REBUILD_WAIT_S, interval=0.2, message="maintenance to rebuild Redis")
