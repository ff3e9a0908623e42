"""Unique jobs and debounce under faults: a worker SIGKILLed mid-job, Redis flushed, and
PostgreSQL stopped and started again, each while producers keep enqueuing unique jobs over a
few keys and debounce arrivals over a few groups through the API.

Invariants under test (the checker's tests/faults/uniquecheck.py, beside every other one):
one job per unique key in scope (no two jobs of a key unfinished at once), and one run per
debounce group's job holding every arrival the API acknowledged, each in exactly the job its
answer named, as the run itself reported.
"""

from __future__ import annotations

import uuid

import pytest

from tests.faults.test_process_faults import leader_pid
from tests.faults.test_server_faults import acked, postgres_outage, wait_acked
from tests.faults.workload import Answer
from tests.helpers import wait_for

pytestmark = pytest.mark.faults

WORK = "fault.work"
KEYS = 4
GROUPS = 3
LIMIT = 300


def semantics_load(run, sleep_s: float = 0.3):
    """Two producer threads: even calls enqueue a unique job over KEYS keys, odd ones a
    debounce arrival over GROUPS groups (delay 0.3 s), until the block ends (bounded)."""
    def make(i: int) -> Answer:
        if i % 2 == 0:
            return run.workload.enqueue_unique(WORK, {"sleep_s": sleep_s},
                                               {"key": f"key-{i // 2 % KEYS}"})
        return run.workload.debounce(WORK, str(uuid.uuid4()), f"group-{i // 2 % GROUPS}", 0.3,
                                     sleep_s=0.05)
    return run.workload.background(make, threads=2, limit=LIMIT)


def assert_semantics_held(run, result) -> None:
    run.assert_clean(result)
    assert result.count("lost") == 0 and result.count("duplicated") == 0
    [(unique_jobs,)] = run.cluster.query(
        "SELECT count(*) FROM taskline.jobs WHERE unique_key IS NOT NULL")
    [(joins,)] = run.cluster.query(
        "SELECT count(*) FROM taskline.job_events WHERE event = 'joined'")
    unique_answers = sum(1 for r in run.history.entries("request")
                         if r["status"] in (200, 201) and "debounce" not in r["path"])
    assert unique_jobs < unique_answers  # duplicates were returned, not written
    assert joins > 0  # arrivals joined waiting jobs


@pytest.mark.fast
@pytest.mark.timeout(150)
def test_unique_and_debounce_with_redis_flushed(fault_run):
    run = fault_run("unique and debounce: FLUSHALL under load", workers=2, concurrency=4)
    with semantics_load(run) as answers:
        wait_acked(answers, 40)
        run.nemesis.flushall()
        wait_acked(answers, 100)
    result = run.check()
    assert_semantics_held(run, result)


@pytest.mark.timeout(180)
def test_unique_and_debounce_with_a_worker_killed_mid_job(fault_run):
    run = fault_run("unique and debounce: worker SIGKILL mid-job", workers=2, concurrency=2,
                    supervise=True)
    with semantics_load(run, sleep_s=1.0) as answers:
        wait_acked(answers, 20)
        run.nemesis.kill_busy_worker()
        wait_acked(answers, 60)
        run.nemesis.kill_busy_worker()
        wait_acked(answers, 100)
    result = run.check(wait_s=90)
    assert_semantics_held(run, result)


@pytest.mark.timeout(180)
def test_unique_and_debounce_with_postgres_restarted(fault_run):
    run = fault_run("unique and debounce: PostgreSQL stopped 5 s", workers=2, concurrency=4)
    with semantics_load(run) as answers:
        postgres_outage(run, answers, 5.0, crash=False)
        assert acked(answers) > 0
    result = run.check(wait_s=90)
    assert_semantics_held(run, result)


@pytest.mark.timeout(180)
def test_a_unique_schedule_with_its_leader_killed(fault_run):
    """A schedule firing every second whose job (running ~2.5 s) is unique: slots while its
    job runs fire none; the maintenance leader is SIGKILLed and the standby takes over."""
    run = fault_run("unique schedule, maintenance leader killed", workers=1, concurrency=2,
                    maintenance=2, supervise=True)
    pids = {s.pid for s in run.cluster.maintenances}
    wait_for(lambda: leader_pid(run) in pids, timeout=15, message="a maintenance leader")
    made = run.workload.call("schedule", "PUT", "/api/v1/schedules/tick", {
        "cron": "* * * * * *", "job": {"type": WORK, "payload": {"sleep_s": 2.5},
                                       "unique": {"key": "tick"}}}, key=None)
    assert made.status == 201, made.body
    wait_for(lambda: _slots(run) >= 4, timeout=30, message="slots of the schedule")
    leader = next(s for s in run.cluster.maintenances if s.pid == leader_pid(run))
    run.nemesis.kill(leader)
    wait_for(lambda: leader_pid(run) in pids - {leader.pid}, timeout=20,
             message="the standby to take over")
    settled = _slots(run)
    wait_for(lambda: _slots(run) >= settled + 4, timeout=30, message="slots after takeover")
    paused = run.workload.call("schedule", "PUT", "/api/v1/schedules/tick", {
        "cron": "* * * * * *", "paused": True,
        "job": {"type": WORK, "payload": {"sleep_s": 2.5}, "unique": {"key": "tick"}}},
        key=None)
    assert paused.status == 200, paused.body
    run.cluster.wait_idle(timeout=30)
    result = run.check(wait_s=60)
    run.assert_clean(result)
    [(jobs,)] = run.cluster.query("SELECT count(*) FROM taskline.jobs WHERE schedule = 'tick'")
    assert 0 < jobs < _slots(run)  # slots folded into the running job made none


def _slots(run) -> int:
    [(n,)] = run.cluster.query("SELECT count(*) FROM taskline.schedule_slots "
                               "WHERE schedule = 'tick'")
    return n
