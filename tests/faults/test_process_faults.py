"""Process faults: workers and maintenance killed, frozen and resumed, poison and hanging jobs,
a crash inside the completion transaction, and the load test. Each scenario runs a real cluster
on fresh private servers, records its history, and is judged by the offline checker.

Invariant under test: every acknowledged job ends in exactly one recorded outcome, runs again
only after its previous lease expired, and commits its database side effect exactly once.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest

from tests.faults.checker import stale_rejections
from tests.faults.nemesis import executing_jobs
from tests.helpers import wait_for

pytestmark = pytest.mark.faults

WORK = "fault.work"
WORK_ASYNC = "fault.work_async"
HANDLER_KINDS = pytest.mark.parametrize("work", [WORK, WORK_ASYNC], ids=["thread", "async"])
"""Scenarios where a handler runs: once with a thread handler, once with a coroutine."""
LEASE_S = 2.0


def enqueue_work(run, n: int, sleep_s: float = 0.0, job_type: str = WORK,
                 payload: dict | None = None, **fields) -> list[str]:
    body = {"sleep_s": sleep_s, **(payload or {})}
    answers = run.workload.many([lambda: run.workload.enqueue(job_type, body, **fields)] * n)
    assert all(a.ok for a in answers), [(a.status, a.body) for a in answers]
    return [a.job_id for a in answers]


def job_row(run, job_id: str):
    return run.cluster.store.get_job(job_id)


def leases(run, job_id: str) -> list[dict]:
    return run.cluster.store.get_history(job_id)[1]


def wait_status(run, job_id: str, status: str, timeout: float = 30.0) -> None:
    wait_for(lambda: job_row(run, job_id).status == status, timeout=timeout, interval=0.1,
             message=f"job {job_id} {status}")


def wait_executing(run, job_id: str, service) -> None:
    wait_for(lambda: job_id in executing_jobs(run.cluster).get(service.pid, []),
             timeout=15, interval=0.02, message=f"{service.name} to run {job_id}")


def effects(run, job_id: str) -> list[tuple]:
    return run.cluster.query("SELECT attempt, worker_id FROM fault_effects WHERE job_id = %s",
                             (job_id,))


def executions(run, job_id: str) -> list[tuple]:
    return run.cluster.query("SELECT attempt, pid FROM fault_exec_log WHERE job_id = %s "
                             "ORDER BY id", (job_id,))


@pytest.mark.fast
@pytest.mark.timeout(90)
@HANDLER_KINDS
def test_worker_sigkill_mid_job(fault_run, work):
    run = fault_run(f"worker SIGKILL mid-job ({work})", workers=2, concurrency=2,
                    supervise=True)
    ids = enqueue_work(run, 6, sleep_s=1.0, job_type=work)
    with ThreadPoolExecutor(len(ids)) as waiters:  # clients waiting for each result
        waits = [waiters.submit(run.workload.wait, job_id) for job_id in ids]
        _victim, jobs = run.nemesis.kill_busy_worker()
        more = enqueue_work(run, 6, sleep_s=0.2, job_type=work)
        told = [w.result().body.get("status") for w in waits]
    result = run.check()
    run.assert_clean(result)
    assert result.acknowledged == len(ids) + len(more)
    assert told == ["succeeded"] * len(ids)  # woken by each finish, the re-run ones included
    for job_id in jobs:
        job = job_row(run, job_id)
        assert job.status == "succeeded" and job.attempts == 2, job
        assert [lease["outcome"] for lease in leases(run, job_id)] == ["lost", "succeeded"]
        assert len(effects(run, job_id)) == 1
    assert result.count("recovered") >= len(jobs)
    assert run.cluster.restarts >= 1


@pytest.mark.fast
@pytest.mark.timeout(90)
def test_worker_sigkill_mid_job_in_a_schema_of_its_own(fault_run):
    """The same fault in an installation under another TASKLINE_SCHEMA: every service, the
    suite's own statements and the checker follow the setting."""
    run = fault_run("worker SIGKILL mid-job, TASKLINE_SCHEMA=tl_fault", workers=2,
                    concurrency=2, supervise=True, settings={"schema": "tl_fault"})
    ids = enqueue_work(run, 4, sleep_s=1.0)
    _victim, jobs = run.nemesis.kill_busy_worker()
    result = run.check()
    run.assert_clean(result)
    assert result.acknowledged == len(ids) and result.count("recovered") >= len(jobs) >= 1
    assert run.cluster.query("SELECT count(*) FROM tl_fault.jobs WHERE status = 'succeeded'"
                             ) == [(len(ids),)]


@pytest.mark.fast
@pytest.mark.timeout(90)
@HANDLER_KINDS
def test_worker_sigstop_past_its_lease_then_sigcont(fault_run, work):
    run = fault_run(f"worker SIGSTOP past its lease, then SIGCONT ({work})", workers=1,
                    concurrency=1)
    zombie = run.cluster.workers[0]
    [job_id] = enqueue_work(run, 1, sleep_s=1.5, job_type=work)
    wait_executing(run, job_id, zombie)
    run.nemesis.stop(zombie)
    rescuer = run.cluster.add_worker()
    wait_status(run, job_id, "succeeded")
    run.nemesis.cont(zombie)
    wait_for(lambda: stale_rejections(e for e in run.cluster.log_events(("worker",))
                                      if e["_service"] == zombie.name) >= 1,
             timeout=10, message="the zombie's outcome to be refused")
    more = enqueue_work(run, 4, sleep_s=0.1, job_type=work)  # the thawed zombie takes work
    result = run.check()
    run.assert_clean(result)
    job = job_row(run, job_id)
    assert job.attempts == 2
    assert [lease["outcome"] for lease in leases(run, job_id)] == ["lost", "succeeded"]
    [(attempt, worker_id)] = effects(run, job_id)
    assert attempt == 2 and worker_id.split("-")[-2] == str(rescuer.pid)
    assert result.stale >= 1 and result.acknowledged == 1 + len(more)


@pytest.mark.fast
@pytest.mark.timeout(90)
def test_sigstop_for_half_a_lease_is_not_reaped(fault_run):
    """Three pauses of half a lease, at different points of the renewal cycle."""
    run = fault_run("SIGSTOP for half a lease (no false reap)", workers=1, concurrency=1)
    worker = run.cluster.workers[0]
    [job_id] = enqueue_work(run, 1, sleep_s=7.0)
    wait_executing(run, job_id, worker)
    for pause in range(3):
        with run.nemesis.stopped(worker, LEASE_S / 2):
            pass
        # A pause, not a poll: it shifts the next freeze to another point of the renewal cycle.
        time.sleep(0.9 + 0.3 * pause)
    result = run.check(runs=3)
    run.assert_clean(result)
    job = job_row(run, job_id)
    assert job.status == "succeeded" and job.attempts == 1
    assert [lease["outcome"] for lease in leases(run, job_id)] == ["succeeded"]
    assert len(executions(run, job_id)) == 1
    assert result.count("ok") == 1 and result.stale == 0


@pytest.mark.fast
@pytest.mark.timeout(90)
@pytest.mark.parametrize("suffix", ["", "_async"], ids=["thread", "async"])
def test_crash_after_the_handler_before_the_completion_commit(fault_run, suffix):
    run = fault_run("crash after the handler, before the completion commit"
                    + (" (async)" if suffix else ""),
                    workers=1, concurrency=2, supervise=True)
    crashing = enqueue_work(run, 3, job_type=f"fault.crash_before_commit{suffix}")
    plain = enqueue_work(run, 5, sleep_s=0.1, job_type=WORK + suffix)
    result = run.check()
    run.assert_clean(result)
    ran_then_crashed = 0
    for job_id in crashing:
        job = job_row(run, job_id)
        assert job.status == "succeeded" and job.attempts >= 2, job
        ran = [attempt for attempt, _ in executions(run, job_id)]
        # A job claimed beside the one whose hook killed the process may die before its own
        # handler starts: its lost attempt counts but has no execution. No attempt runs twice.
        assert ran[-1] == job.attempts and len(ran) == len(set(ran)), ran
        ran_then_crashed += 1 in ran
        # The earlier attempts' effects rolled back with their uncommitted completions.
        assert [a for a, _ in effects(run, job_id)] == [job.attempts]
    assert ran_then_crashed >= 1  # a handler ended and its completion never committed
    assert result.acknowledged == len(crashing) + len(plain)
    assert run.cluster.restarts >= 1 and result.faults == run.cluster.restarts


@pytest.mark.timeout(120)
def test_poison_job_reaches_the_dlq_while_work_flows(fault_run):
    run = fault_run("poison job kills its worker every time", workers=2, concurrency=2,
                    supervise=True)
    poison = run.workload.enqueue("fault.kill_worker", {}, max_retries=2)
    assert poison.ok
    with run.workload.background(lambda i: run.workload.enqueue(WORK, {"sleep_s": 0.05}),
                                 threads=1, limit=400) as answers:
        wait_status(run, poison.job_id, "dead", timeout=60)
    result = run.check()
    run.assert_clean(result)
    job = job_row(run, poison.job_id)
    assert job.attempts == 3 and len(executions(run, poison.job_id)) == 3
    dlq = run.workload.call("dlq", "GET", "/api/v1/dlq", None, key=None)
    assert poison.job_id in [entry["job"]["id"] for entry in dlq.body["jobs"]]
    assert run.cluster.restarts >= 3
    first, last = (lease["leased_at"] for lease in leases(run, poison.job_id)[::2])
    flowed = run.cluster.query("SELECT count(*) FROM taskline.jobs WHERE type = %s "
                               "AND status = 'succeeded' AND updated_at BETWEEN %s AND %s",
                               (WORK, first, last))[0][0]
    assert flowed > 0 and len(answers) > 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("hang_type", ["fault.hang", "fault.hang_async"],
                         ids=["thread", "async"])
def test_handler_that_hangs_forever_times_out(fault_run, hang_type):
    run = fault_run(f"handler hangs forever (timeout, no endless renewal; {hang_type})",
                    workers=1, concurrency=1, supervise=True)
    hang = run.workload.enqueue(hang_type, {}, timeout_s=1, max_retries=1)
    assert hang.ok
    wait_status(run, hang.job_id, "dead", timeout=40)
    plain = enqueue_work(run, 3, sleep_s=0.1)  # the (recycled) worker still takes work
    result = run.check()
    run.assert_clean(result)
    held = leases(run, hang.job_id)
    assert [lease["outcome"] for lease in held] == ["timeout", "timeout"]
    for lease in held:
        assert (lease["released_at"] - lease["leased_at"]).total_seconds() < 1 + LEASE_S
        assert lease["leased_until"] <= lease["released_at"] + timedelta(seconds=LEASE_S)
    assert result.acknowledged == 1 + len(plain)
    logs = run.cluster.log_events(("worker",))
    assert any(e.get("action") == "recycle" for e in logs), "two abandoned handlers > 1 slot"


@pytest.mark.timeout(120)
def test_maintenance_killed_for_a_while(fault_run):
    run = fault_run("maintenance killed for a while", workers=2, concurrency=2, supervise=True)
    maintenance = run.cluster.maintenances[0]
    run.nemesis.kill(maintenance)
    ids = enqueue_work(run, 4, sleep_s=1.0)
    retrying = enqueue_work(run, 3, payload={"fail_first": 1})
    delayed = enqueue_work(run, 2, delay_s=0.5)
    _victim, orphaned = run.nemesis.kill_busy_worker()
    wait_for(lambda: all(job_row(run, j).status == "retrying" for j in retrying), timeout=15,
             message="failed jobs waiting for their retry")
    # Asserting that nothing happens takes time: two leases pass with nobody to reap or promote.
    time.sleep(2 * LEASE_S)
    assert all(job_row(run, j).status == "running" for j in orphaned)
    assert all(job_row(run, j).status in ("retrying",) for j in retrying)
    assert all(job_row(run, j).status == "scheduled" for j in delayed)
    run.nemesis.restart(maintenance)
    result = run.check()
    run.assert_clean(result)
    assert result.acknowledged == len(ids) + len(retrying) + len(delayed)
    assert all(job_row(run, j).attempts == 2 for j in orphaned + retrying)


def leader_pid(run) -> int | None:
    rows = run.cluster.query("SELECT holder FROM taskline.leader_leases WHERE leased_until > now()")
    return int(rows[0][0].split(":")[1]) if rows else None


@pytest.mark.timeout(150)
def test_two_maintenance_instances_at_once(fault_run):
    run = fault_run("two maintenance instances at once", workers=2, concurrency=2,
                    maintenance=2, supervise=True)
    pids = {s.pid for s in run.cluster.maintenances}
    wait_for(lambda: leader_pid(run) in pids, timeout=15, message="a maintenance leader")
    first = enqueue_work(run, 6, sleep_s=0.8) + enqueue_work(run, 4, payload={"fail_first": 1})
    run.nemesis.kill_busy_worker()
    run.cluster.wait_idle(timeout=40)
    leader = next(s for s in run.cluster.maintenances if s.pid == leader_pid(run))
    run.nemesis.kill(leader)
    second = enqueue_work(run, 6, sleep_s=0.8) + enqueue_work(run, 4, payload={"fail_first": 1})
    run.nemesis.kill_busy_worker()
    wait_for(lambda: leader_pid(run) in pids - {leader.pid}, timeout=20,
             message="the standby to take over")
    result = run.check()
    run.assert_clean(result)
    assert result.acknowledged == len(first) + len(second)
    assert result.count("recovered") >= 10


@pytest.mark.timeout(120)
def test_promoter_killed_mid_promotion(fault_run):
    run = fault_run("promoter killed mid-promotion", workers=1, concurrency=4,
                    proxied={("maintenance", "redis")})
    link = run.cluster.proxy("maintenance", "redis")
    jobs = [{"type": WORK, "payload": {}, "delay_s": 1.5} for _ in range(200)]
    answer = run.workload.enqueue_batch(jobs)
    assert answer.ok
    ids = [j["job"]["id"] for j in answer.body["jobs"]]
    link.blackhole(True)
    run.nemesis.fault("blackhole", "maintenance->redis")
    wait_for(lambda: run.cluster.query("SELECT count(*) FROM taskline.jobs WHERE status = 'queued' "
                                       "AND id = ANY(%s::uuid[])", (ids,))[0][0] == len(ids),
             timeout=20, message="the promoter to commit the promotion")
    maintenance = run.cluster.maintenances[0]
    run.nemesis.kill(maintenance)  # its push to Redis is still hanging in the blackhole
    ready = run.cluster.dispatcher.client.llen("taskline:{default}:ready:5")
    assert ready == 0, "the promotion must not have reached Redis"
    link.blackhole(False)
    run.nemesis.heal("blackhole", "maintenance->redis")
    run.nemesis.restart(maintenance)
    result = run.check()
    run.assert_clean(result)
    assert result.acknowledged == len(ids)
    assert result.count("ok") == len(ids)


@pytest.mark.fast
@pytest.mark.timeout(180)
def test_load_3000_jobs_on_4_workers_run_once_each(fault_run):
    run = fault_run("3,000 jobs on 4 worker processes x 4 slots, half of them async",
                    workers=4, concurrency=4, api_workers=2)
    # Thread and coroutine handlers interleaved in every worker, sharing its four slots.
    batches = [[{"type": (WORK, WORK_ASYNC)[n % 2], "payload": {}} for n in range(100)]
               for _ in range(30)]
    answers = run.workload.many([lambda b=b: run.workload.enqueue_batch(b) for b in batches],
                                threads=3)
    assert all(a.ok for a in answers)
    result = run.check(wait_s=150)
    run.assert_clean(result)
    assert result.acknowledged == 3000 and result.count("ok") == 3000
    counts = run.cluster.query("SELECT count(*), count(DISTINCT job_id) FROM fault_exec_log")[0]
    assert counts == (3000, 3000), "each job executed exactly once"
    effect_counts = run.cluster.query(
        "SELECT count(*), count(DISTINCT job_id) FROM fault_effects")[0]
    assert effect_counts == (3000, 3000)
    pids = {pid for (pid,) in run.cluster.query("SELECT DISTINCT pid FROM fault_exec_log")}
    assert len(pids) == 4, "all four worker processes took part"
