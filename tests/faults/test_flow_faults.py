"""Flow limits under faults: a concurrency limit while a busy worker is SIGKILLed, Redis is
flushed and a worker is frozen past its lease; a rate limit while Redis is killed and restarted
empty. Each runs a real cluster on fresh servers with producers enqueuing through the API, and
is judged by the offline checker, whose own model adds "no instant with more than `concurrency`
open leases of a scope" and "no sliding window of `period_s` with more than `limit` starts",
both read from `job_leases`.

Invariant under test: a limit binds the whole cluster and holds exactly under faults: a killed
worker's slot frees only when the reaper ends its lease, a frozen worker's late outcome is
refused by the fence and its attempt is not counted twice, and Redis losing everything changes
nothing, because budgets are taken in PostgreSQL under the limits' row locks.
"""

from __future__ import annotations

import time

import pytest
import requests

from tests.faults.checker import busiest_window, peak_open
from tests.helpers import wait_for

pytestmark = pytest.mark.faults

WORK = "fault.work"


def put_limit(run, scope: str, body: dict) -> None:
    answer = requests.put(f"{run.cluster.api_url}/api/v1/limits/{scope}", json=body, timeout=10)
    assert answer.status_code == 201, answer.text


def acked(answers) -> int:
    return sum(1 for a in list(answers) if a.ok)


def wait_acked(answers, n: int, timeout: float = 60.0) -> None:
    wait_for(lambda: acked(answers) >= n, timeout=timeout, interval=0.05,
             message=f"{n} acknowledged enqueues")


def leases_of(run, job_type: str) -> list[dict]:
    rows = run.cluster.query(
        "SELECT l.leased_at, l.released_at FROM taskline.job_leases l JOIN taskline.jobs j ON "
        "j.id = l.job_id "
        "WHERE j.type = %s", (job_type,))
    return [{"leased_at": a, "released_at": b} for a, b in rows]


@pytest.mark.timeout(150)
def test_concurrency_limit_through_sigkill_flush_and_a_frozen_worker(fault_run):
    run = fault_run("concurrency limit: worker SIGKILL, Redis flush, frozen worker",
                    workers=3, concurrency=4, supervise=True)
    put_limit(run, f"type:{WORK}", {"concurrency": 3})
    with run.workload.background(lambda i: run.workload.enqueue(WORK, {"sleep_s": 0.3}),
                                 threads=2, limit=120) as answers:
        wait_acked(answers, 20)
        run.nemesis.kill_busy_worker()
        wait_acked(answers, 50)
        run.nemesis.flushall()
        wait_acked(answers, 80)
        busy = next(w for w in run.cluster.workers if w.alive)
        with run.nemesis.stopped(busy, 3.0):  # past its 2 s lease
            time.sleep(0.1)
        wait_acked(answers, 120)
    result = run.check(wait_s=120)
    run.assert_clean(result)  # includes the checker's own limit judgement
    assert result.count("lost") == 0 and result.count("duplicated") == 0
    assert peak_open(leases_of(run, WORK)) == 3  # the budget was used, never exceeded


@pytest.mark.timeout(150)
def test_rate_limit_through_redis_killed_and_restarted_empty(fault_run):
    run = fault_run("rate limit: Redis killed and restarted empty", workers=2, concurrency=4)
    put_limit(run, f"type:{WORK}", {"rate": {"limit": 10, "period_s": 1}})
    with run.workload.background(lambda i: run.workload.enqueue(WORK, {"sleep_s": 0.0}),
                                 threads=2, limit=80) as answers:
        wait_acked(answers, 20)
        run.nemesis.kill_redis()
        time.sleep(2.0)
        run.nemesis.start_redis()
        wait_acked(answers, 80)
    result = run.check(wait_s=120)
    run.assert_clean(result)
    assert result.count("lost") == 0 and result.count("duplicated") == 0
    starts = [lease["leased_at"] for lease in leases_of(run, WORK)]
    assert busiest_window(starts, 1.0) == 10  # the budget was used, never exceeded
