"""Workflow faults: a worker SIGKILLed mid-step, a SIGSTOPped zombie finishing a parent late,
Redis flushed while steps wait, PostgreSQL restarted mid-workflow. Each scenario submits
workflows through the real API, and the checker judges, beside every job invariant, that each
step ran only once its condition held and was released exactly once
(tests/faults/workflowcheck.py). The same four faults strike workflows with `when` steps
(`any_failed`, `always`) while their parents run: each failure step runs exactly once, and
an `any_failed` step whose parents all succeed is cancelled as condition_unmet, never run.
"""

from __future__ import annotations

import time

import pytest

from tests.faults.checker import stale_rejections
from tests.faults.test_process_faults import executions, job_row, wait_executing, wait_status
from tests.helpers import wait_for

pytestmark = pytest.mark.faults

WORK = "fault.work"


def step(step_id: str, after: list[str] = (), sleep_s: float = 0.0) -> dict:
    return {"id": step_id, "job": {"type": WORK, "payload": {"sleep_s": sleep_s}},
            "after": list(after)}


def fan(parts: int, sleep_s: float, root_sleep_s: float = 0.0) -> list[dict]:
    """root -> parts in parallel -> merge: a report built from its parts."""
    names = [f"part{i}" for i in range(parts)]
    return [step("root", sleep_s=root_sleep_s), *(step(n, ["root"], sleep_s) for n in names),
            step("merge", names, 0.1)]


def submit(run, steps: list[dict], name: str = "report") -> dict[str, str]:
    """Submit a workflow; step id -> job id."""
    answer = run.workload.submit_workflow(name, steps)
    assert answer.ok, (answer.status, answer.body)
    return {s["id"]: s["job_id"] for s in answer.body["steps"]}


def unblocked(run, job_id: str) -> int:
    return len(run.cluster.query("SELECT 1 FROM taskline.job_events WHERE job_id = %s "
                                 "AND event = 'unblocked'", (job_id,)))


def assert_each_ran_once_after_release(run, jobs: dict[str, str]) -> None:
    for step_id, job_id in jobs.items():
        if step_id != "root":
            assert unblocked(run, job_id) == 1, step_id
    assert len(executions(run, jobs["merge"])) == 1


@pytest.mark.timeout(120)
def test_worker_sigkill_mid_step(fault_run):
    run = fault_run("workflow: worker SIGKILL mid-step", workers=2, concurrency=2,
                    supervise=True)
    jobs = submit(run, fan(6, sleep_s=1.0))
    _victim, killed = run.nemesis.kill_busy_worker()
    result = run.check()
    run.assert_clean(result)
    assert result.acknowledged == len(jobs)
    assert killed and set(killed) <= set(jobs.values())
    assert result.count("recovered") >= len(killed)
    assert_each_ran_once_after_release(run, jobs)


@pytest.mark.timeout(120)
def test_sigstop_zombie_finishes_a_parent_late(fault_run):
    run = fault_run("workflow: SIGSTOP zombie finishing a parent late", workers=1,
                    concurrency=1)
    zombie = run.cluster.workers[0]
    jobs = submit(run, [step("root", sleep_s=1.5), step("child", ["root"]),
                        step("merge", ["child"])])
    wait_executing(run, jobs["root"], zombie)
    run.nemesis.stop(zombie)
    run.cluster.add_worker()
    wait_status(run, jobs["merge"], "succeeded")
    run.nemesis.cont(zombie)  # it finishes the parent late: its outcome must be refused
    wait_for(lambda: stale_rejections(e for e in run.cluster.log_events(("worker",))
                                      if e["_service"] == zombie.name) >= 1,
             timeout=10, message="the zombie's outcome to be refused")
    result = run.check()
    run.assert_clean(result)
    assert result.stale >= 1
    assert len(executions(run, jobs["root"])) == 2
    assert len(executions(run, jobs["child"])) == 1
    assert_each_ran_once_after_release(run, jobs)


@pytest.mark.timeout(120)
def test_redis_flushed_while_steps_wait(fault_run):
    run = fault_run("workflow: Redis flushed while steps wait", workers=2, concurrency=4)
    first = submit(run, fan(10, sleep_s=0.1, root_sleep_s=2.0), name="first")
    queued = submit(run, [step("root", sleep_s=0.2), step("after", ["root"])], name="queued")
    wait_for(lambda: len(executions(run, first["root"])) == 1, timeout=15,
             message="the first root to run")
    run.nemesis.flushall()
    result = run.check()
    run.assert_clean(result)
    assert result.acknowledged == len(first) + len(queued)
    assert_each_ran_once_after_release(run, first)
    assert len(executions(run, first["root"])) == 1  # the flush cost no lease


@pytest.mark.timeout(180)
def test_postgres_restarted_mid_workflow(fault_run):
    run = fault_run("workflow: PostgreSQL restarted mid-workflow", workers=2, concurrency=4)
    jobs = submit(run, fan(8, sleep_s=1.5))
    wait_for(lambda: any(executions(run, jobs[f"part{i}"]) for i in range(8)), timeout=15,
             message="the parts to run")
    run.nemesis.stop_postgres()
    time.sleep(3.0)
    run.nemesis.start_postgres()
    result = run.check(wait_s=90)
    run.assert_clean(result)
    assert result.acknowledged == len(jobs)
    assert_each_ran_once_after_release(run, jobs)


# --- steps that run when a workflow fails ---------------------------------------------------

def guarded(sleep_s: float, fails: bool) -> list[dict]:
    """Two parents (`load` failing for good on its only attempt when `fails`), a step of each
    condition after them, and an ordinary step after `load`."""
    load = step("load", sleep_s=sleep_s)
    if fails:
        load["job"]["payload"].update(fail_executions=99, non_retryable=True)
        load["job"]["max_retries"] = 0
    return [load, step("ok", sleep_s=sleep_s),
            {**step("on_fail", ["load", "ok"]), "when": "any_failed"},
            {**step("finally", ["load", "ok"]), "when": "always"}]


def submit_guarded(run, sleep_s: float) -> tuple[dict[str, str], dict[str, str]]:
    """A workflow whose `load` dies, and one whose parents all succeed."""
    return (submit(run, guarded(sleep_s, fails=True), name="failing"),
            submit(run, guarded(sleep_s, fails=False), name="passing"))


def ends(failing: dict[str, str], passing: dict[str, str] | None = None) -> dict:
    """The checker's allowed end states beyond success: the failing parent dies, the passing
    workflow's any_failed step is cancelled as its condition was unmet."""
    allowed = {failing["load"]: {"dead"}}
    return {**allowed, passing["on_fail"]: {"cancelled"}} if passing else allowed


def assert_when_steps_ran_once(run, failing: dict[str, str], passing: dict[str, str]) -> None:
    for step_id in ("on_fail", "finally"):
        assert unblocked(run, failing[step_id]) == 1, step_id
        assert len(executions(run, failing[step_id])) == 1, step_id
    assert unblocked(run, passing["finally"]) == 1
    assert len(executions(run, passing["finally"])) == 1
    assert unblocked(run, passing["on_fail"]) == 0 and not executions(run, passing["on_fail"])
    unmet = run.cluster.query(
        "SELECT 1 FROM taskline.job_events WHERE job_id = %s AND event = 'cancelled' "
        "AND detail ->> 'cause' = 'condition_unmet'", (passing["on_fail"],))
    assert len(unmet) == 1
    assert job_row(run, failing["load"]).status == "dead"


@pytest.mark.timeout(120)
def test_failure_steps_under_worker_sigkill(fault_run):
    run = fault_run("workflow when: worker SIGKILL while the parents run", workers=2,
                    concurrency=2, supervise=True)
    failing, passing = submit_guarded(run, sleep_s=1.0)
    _victim, killed = run.nemesis.kill_busy_worker()
    result = run.check(expect=ends(failing, passing))
    run.assert_clean(result)
    assert result.acknowledged == len(failing) + len(passing)
    assert killed and result.count("recovered") >= len(killed)
    assert_when_steps_ran_once(run, failing, passing)


@pytest.mark.timeout(120)
def test_failure_step_released_by_the_reaper_while_a_zombie_holds_the_parent(fault_run):
    run = fault_run("workflow when: SIGSTOP zombie holding the failing parent", workers=1,
                    concurrency=1)
    zombie = run.cluster.workers[0]
    failing = submit(run, guarded(1.5, fails=True), name="failing")
    wait_executing(run, failing["load"], zombie)
    run.nemesis.stop(zombie)
    run.cluster.add_worker()  # `load` had its only attempt: the reaper's recovery kills it
    wait_status(run, failing["on_fail"], "succeeded")
    run.nemesis.cont(zombie)  # it finishes `load` late: its outcome must be refused
    wait_for(lambda: stale_rejections(e for e in run.cluster.log_events(("worker",))
                                      if e["_service"] == zombie.name) >= 1,
             timeout=10, message="the zombie's outcome to be refused")
    result = run.check(expect=ends(failing))
    run.assert_clean(result)
    assert result.stale >= 1
    assert len(executions(run, failing["load"])) == 1
    for step_id in ("on_fail", "finally"):
        assert unblocked(run, failing[step_id]) == 1, step_id
        assert len(executions(run, failing[step_id])) == 1, step_id
    assert run.cluster.query("SELECT 1 FROM taskline.job_events WHERE job_id = %s "
                             "AND event = 'recovered' AND detail ->> 'status' = 'dead'",
                             (failing["load"],))


@pytest.mark.fast
@pytest.mark.timeout(90)
def test_failure_steps_when_redis_is_flushed_while_they_wait(fault_run):
    run = fault_run("workflow when: Redis flushed while the failure steps wait", workers=2,
                    concurrency=4)
    failing, passing = submit_guarded(run, sleep_s=1.0)
    wait_for(lambda: executions(run, failing["load"]), timeout=15, message="load to run")
    run.nemesis.flushall()
    result = run.check(expect=ends(failing, passing))
    run.assert_clean(result)
    assert result.acknowledged == len(failing) + len(passing)
    assert_when_steps_ran_once(run, failing, passing)


@pytest.mark.timeout(180)
def test_failure_steps_when_postgres_restarts_while_the_parents_run(fault_run):
    run = fault_run("workflow when: PostgreSQL restarted while the parents run", workers=2,
                    concurrency=4)
    failing, passing = submit_guarded(run, sleep_s=1.5)
    wait_for(lambda: executions(run, failing["load"]) and executions(run, passing["ok"]),
             timeout=15, message="the parents to run")
    run.nemesis.stop_postgres()
    time.sleep(3.0)
    run.nemesis.start_postgres()
    result = run.check(wait_s=90, expect=ends(failing, passing))
    run.assert_clean(result)
    assert result.acknowledged == len(failing) + len(passing)
    assert_when_steps_ran_once(run, failing, passing)
