"""Redis down, work goes on: scenarios where Redis is gone for good, flaps, comes back holding an
old snapshot, or is cut off from the workers only. Each runs a real cluster on fresh servers
with producers enqueuing through the API the whole time, and is judged by the offline checker.

Invariant under test: a Redis outage slows dispatch and stops nothing. Workers claim due jobs
straight from PostgreSQL while they cannot reach Redis, every acknowledged job finishes (also
while Redis stays down), nothing runs twice, and workers go back to Redis only once it was
rebuilt, so no job is stranded by a Redis that came back empty or stale.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from taskline.dispatch.keys import QueueKeys
from tests.faults.test_server_faults import WORK, acked, assert_ran_once, wait_acked
from tests.helpers import wait_for

pytestmark = pytest.mark.faults

PACE_S = 0.05
"""Pause of each producer thread between enqueues: about 40 jobs a second, a load that lasts
as long as the scenario does."""


def load(run, sleep_s: float = 0.05):
    """Two producer threads enqueuing fault.work jobs at a steady pace until the block ends."""
    def make(_i: int):
        time.sleep(PACE_S)
        return run.workload.enqueue(WORK, {"sleep_s": sleep_s})
    return run.workload.background(make, threads=2, limit=5000)


def switches(run, mode: str) -> list[dict]:
    """The workers' logged switches to `mode` (one record per switch)."""
    return [r for r in run.cluster.log_events(("worker",))
            if r.get("action") == "dispatch_mode" and r.get("mode") == mode]


def switch_counts(run, mode: str) -> Counter[str]:
    """Switches to `mode` so far, per worker service."""
    return Counter(r["_service"] for r in switches(run, mode))


def wait_switched(run, mode: str, before: Counter[str] | None = None,
                  timeout: float = 20.0) -> None:
    """Until every worker switched to `mode` more often than `before` counted."""
    before = before or Counter()

    def switched() -> bool:
        now = switch_counts(run, mode)
        return all(now[w.name] > before[w.name] for w in run.cluster.workers)
    wait_for(switched, timeout=timeout, interval=0.1,
             message=f"every worker to switch to {mode} dispatch")


def succeeded_ids(run) -> list[str]:
    return [str(job_id) for (job_id,) in run.cluster.query(
        "SELECT id FROM taskline.jobs WHERE status = 'succeeded' ORDER BY id")]


@pytest.mark.timeout(150)
def test_redis_killed_for_good_under_load(fault_run):
    run = fault_run("Redis killed for good under load (dispatch from PostgreSQL)", workers=2,
                    concurrency=4)
    with load(run, sleep_s=0.05) as answers:
        wait_acked(answers, 30)
        run.nemesis.kill_redis()
        down_from = acked(answers)
        wait_switched(run, "postgres")
        wait_acked(answers, down_from + 80)  # accepted and run while Redis stays down
    # Redis never comes back: every acknowledged job must finish all the same.
    result = run.check(redis_gone=True)
    assert_ran_once(run, result)
    assert result.acknowledged >= down_from + 80
    assert switches(run, "redis") == []


@pytest.mark.timeout(240)
def test_redis_flapping_down_5s_up_5s_for_a_minute(fault_run):
    run = fault_run("Redis flapping: down 5 s, up 5 s, for a minute", workers=2, concurrency=4)
    with load(run, sleep_s=0.05) as answers:
        wait_acked(answers, 30)
        for _ in range(6):
            run.nemesis.kill_redis()
            time.sleep(5.0)
            run.nemesis.start_redis()
            time.sleep(5.0)
        healed_at = acked(answers)
        wait_acked(answers, healed_at + 20)
    result = run.check(wait_s=90)
    assert_ran_once(run, result)
    assert switches(run, "postgres") and switches(run, "redis")


@pytest.mark.timeout(180)
def test_redis_back_with_a_stale_snapshot(fault_run):
    """Redis restored from an old snapshot: the ready lists hold ids of jobs long finished and
    the rebuild marker of that time; the jobs queued since are in none of them."""
    run = fault_run("Redis back from a stale snapshot (finished ids, old marker)", workers=2,
                    concurrency=4)
    with load(run, sleep_s=0.05) as answers:
        wait_acked(answers, 40)
        wait_for(lambda: len(succeeded_ids(run)) >= 20, timeout=30, message="finished jobs")
        old_ids = succeeded_ids(run)
        old_marker = run.cluster.dispatcher.dispatch_marker()
        assert old_marker is not None, "the rebuilder keeps a marker while Redis is up"
        run.nemesis.kill_redis()
        down_from = acked(answers)
        wait_switched(run, "postgres")
        wait_acked(answers, down_from + 30)
        back = switch_counts(run, "redis")
        run.nemesis.start_redis()
        # The snapshot: finished jobs' ids in the ready lists, and the marker of that time.
        run.nemesis.push_ids(QueueKeys("default").ready(5), old_ids)
        run.cluster.dispatcher.set_dispatch_marker(old_marker)
        wait_switched(run, "redis", back, timeout=40)  # only once it was rebuilt
        wait_acked(answers, down_from + 80)
    result = run.check(wait_s=90)
    assert_ran_once(run, result)
    rebuilt = [r for r in run.cluster.log_events(("maintenance",))
               if r.get("action") == "rebuild" and "missing" in r]
    assert rebuilt, "the stale Redis was not rebuilt"


@pytest.mark.timeout(180)
def test_worker_redis_blackhole_dispatches_from_postgresql(fault_run):
    run = fault_run("workers-to-Redis blackhole (dispatch from PostgreSQL)", workers=2,
                    concurrency=4, proxied={("worker", "redis")})
    with load(run, sleep_s=0.05) as answers:
        wait_acked(answers, 30)
        run.nemesis.blackhole("worker", "redis")
        cut_from = acked(answers)
        wait_switched(run, "postgres")  # a silent link is noticed by socket timeouts
        wait_acked(answers, cut_from + 60)  # the API pushes to Redis; workers claim from PG
        back = switch_counts(run, "redis")
        run.nemesis.reset("worker", "redis")
        run.nemesis.unblackhole("worker", "redis")
        wait_switched(run, "redis", back, timeout=40)
        healed_at = acked(answers)
        wait_acked(answers, healed_at + 30)
    result = run.check(wait_s=90)
    assert_ran_once(run, result)
