"""Schedules under process faults: two maintenance instances, the leader SIGKILLed between two
slots of a schedule firing every two seconds, then restarted beside the new leader.

Invariant under test: each schedule slot enqueues at most one job (the checker's
`slot_violations`), whoever leads and however often an instance dies; slots keep firing once
the standby takes over (the ones missed meanwhile folded into one, `catch_up = latest`).
"""

from __future__ import annotations

import pytest

from tests.faults.test_process_faults import leader_pid
from tests.helpers import wait_for

pytestmark = pytest.mark.faults

CRON = "* * * * * */2"  # every two seconds (a seconds field last)
TICK = {"cron": CRON, "job": {"type": "fault.work", "payload": {"sleep_s": 0.1}}}


def slot_count(run) -> int:
    [(n,)] = run.cluster.query("SELECT count(*) FROM taskline.schedule_slots WHERE schedule = "
                               "'tick'")
    return n


def wait_slots(run, at_least: int, timeout: float = 30.0) -> int:
    return wait_for(lambda: (n := slot_count(run)) >= at_least and n, timeout=timeout,
                    interval=0.05, message=f"{at_least} slots of the schedule to fire")


@pytest.mark.timeout(180)
def test_a_leader_killed_between_slots_never_makes_a_second_job_for_a_slot(fault_run):
    run = fault_run("schedule slots, maintenance leader killed between slots", workers=1,
                    concurrency=2, maintenance=2, supervise=True)
    pids = {s.pid for s in run.cluster.maintenances}
    wait_for(lambda: leader_pid(run) in pids, timeout=15, message="a maintenance leader")
    made = run.workload.call("schedule", "PUT", "/api/v1/schedules/tick", TICK, key=None)
    assert made.status == 201, made.body
    before = wait_slots(run, 3)
    # Right after a slot fired: the kill lands between it and the next one.
    just_fired = wait_slots(run, before + 1, timeout=10)
    leader = next(s for s in run.cluster.maintenances if s.pid == leader_pid(run))
    run.nemesis.kill(leader)
    wait_for(lambda: leader_pid(run) in pids - {leader.pid}, timeout=20,
             message="the standby to take over")
    after_takeover = wait_slots(run, just_fired + 3)
    # The killed instance comes back as a second replica beside the new leader.
    run.nemesis.restart(leader)
    wait_slots(run, after_takeover + 3)
    paused = run.workload.call("schedule", "PUT", "/api/v1/schedules/tick",
                               {**TICK, "paused": True}, key=None)
    assert paused.status == 200 and paused.body["next_runs"] == []
    run.cluster.wait_idle(timeout=30)
    result = run.check()
    run.assert_clean(result)
    jobs = run.cluster.query("SELECT status, count(*) FROM taskline.jobs WHERE schedule = 'tick' "
                             "GROUP BY status")
    assert dict(jobs) == {"succeeded": slot_count(run)}
