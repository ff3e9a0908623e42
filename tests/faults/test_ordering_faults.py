"""Ordering keys, snoozes and expiring jobs under faults: jobs of six keys enqueued through the
API while a busy worker is SIGKILLed, Redis is flushed and a worker is frozen past its lease,
and while PostgreSQL is stopped and started again; jobs that snooze, and jobs that must start
within 1 s, while a busy worker is SIGKILLed and Redis is flushed. Each runs a real cluster on
fresh servers and is judged by the offline checker, whose own model adds "at no instant two
open leases of one queue's ordering key", "a key's jobs first start in enqueue order", "a
snooze consumes no attempt" and "no lease after a job's expiry", read from `job_leases` and
`jobs`.

Invariant under test: a key's jobs start one at a time in enqueue order across every worker: a
killed worker's head keeps its place until the reaper recovers it, a frozen worker's late
outcome is refused by the fence, and Redis losing everything changes nothing, because a keyed
job starts only through PostgreSQL's claim, as its key's head, under a per-key lock. A snooze
never consumes an attempt, whichever worker runs the job next.
"""

from __future__ import annotations

import time

import pytest

from tests.faults.checker import peak_open
from tests.helpers import wait_for

pytestmark = pytest.mark.faults

WORK = "fault.work"
KEYS = 6


def acked(answers) -> int:
    return sum(1 for a in list(answers) if a.ok)


def wait_acked(answers, n: int, timeout: float = 60.0) -> None:
    wait_for(lambda: acked(answers) >= n, timeout=timeout, interval=0.05,
             message=f"{n} acknowledged enqueues")


def keyed_work(run):
    return lambda i: run.workload.enqueue(WORK, {"sleep_s": 0.1}, ordering_key=f"k{i % KEYS}")


def leases_by_key(run) -> dict[str, list[dict]]:
    rows = run.cluster.query(
        "SELECT j.ordering_key, l.leased_at, l.released_at FROM taskline.job_leases l "
        "JOIN taskline.jobs j ON j.id = l.job_id WHERE j.ordering_key IS NOT NULL")
    out: dict[str, list[dict]] = {}
    for key, leased_at, released_at in rows:
        out.setdefault(key, []).append({"leased_at": leased_at, "released_at": released_at})
    return out


def assert_one_at_a_time(run, result) -> None:
    run.assert_clean(result)  # includes the checker's own ordering judgement
    assert result.count("lost") == 0 and result.count("duplicated") == 0
    by_key = leases_by_key(run)
    assert len(by_key) == KEYS and all(peak_open(v) == 1 for v in by_key.values())


@pytest.mark.timeout(180)
def test_ordering_keys_through_sigkill_flush_and_a_frozen_worker(fault_run):
    run = fault_run("ordering keys: worker SIGKILL, Redis flush, frozen worker",
                    workers=3, concurrency=4, supervise=True)
    with run.workload.background(keyed_work(run), threads=2, limit=120) as answers:
        wait_acked(answers, 20)
        run.nemesis.kill_busy_worker()
        wait_acked(answers, 50)
        run.nemesis.flushall()
        wait_acked(answers, 80)
        busy = next(w for w in run.cluster.workers if w.alive)
        with run.nemesis.stopped(busy, 3.0):  # past its 2 s lease
            time.sleep(0.1)
        wait_acked(answers, 120)
    assert_one_at_a_time(run, run.check(wait_s=150))


@pytest.mark.timeout(180)
def test_ordering_keys_through_a_postgres_restart(fault_run):
    run = fault_run("ordering keys: PostgreSQL stopped and started", workers=2, concurrency=4)
    with run.workload.background(keyed_work(run), threads=2, limit=90) as answers:
        wait_acked(answers, 30)
        run.nemesis.stop_postgres()
        time.sleep(2.0)
        run.nemesis.start_postgres()
        wait_acked(answers, 90, timeout=90)
    assert_one_at_a_time(run, run.check(wait_s=150))


@pytest.mark.timeout(180)
def test_snoozes_consume_no_attempt_through_sigkill_and_a_redis_flush(fault_run):
    """Jobs that snooze twice, then work, while a busy worker is SIGKILLed and Redis flushed:
    the checker's own model requires the lease after each `snoozed` one to run the same
    attempt, and every job to end succeeded with one effect."""
    run = fault_run("snooze: worker SIGKILL, Redis flush", workers=2, concurrency=4,
                    supervise=True)
    snoozing = {"sleep_s": 0.2, "snooze_executions": 2, "snooze_s": 0.3}
    with run.workload.background(lambda i: run.workload.enqueue(WORK, snoozing, max_retries=1),
                                 threads=2, limit=60) as answers:
        wait_acked(answers, 20)
        run.nemesis.kill_busy_worker()
        wait_acked(answers, 40)
        run.nemesis.flushall()
        wait_acked(answers, 60)
    result = run.check(wait_s=150)
    run.assert_clean(result)
    assert result.count("lost") == 0 and result.count("duplicated") == 0
    snoozed = run.cluster.query("SELECT count(*) FROM taskline.job_leases "
                                "WHERE outcome = 'snoozed'")[0][0]
    assert snoozed >= 100  # most of the 60 jobs snoozed twice; none counted an attempt for it


@pytest.mark.timeout(180)
def test_expiring_jobs_are_never_leased_late_through_a_redis_flush_and_sigkill(fault_run):
    """Jobs that must start within 1 s, more than two workers can start in time: the late ones
    lapse (cancelled, event lapsed), the rest run once; the checker's own model requires no
    lease after a job's expiry."""
    run = fault_run("expiry: worker SIGKILL, Redis flush", workers=2, concurrency=2,
                    supervise=True)
    expect = {}
    with run.workload.background(
            lambda i: run.workload.enqueue(WORK, {"sleep_s": 0.2}, start_within_s=1.0),
            threads=2, limit=80) as answers:
        wait_acked(answers, 20)
        run.nemesis.kill_busy_worker()
        wait_acked(answers, 50)
        run.nemesis.flushall()
        wait_acked(answers, 80)
    for answer in answers:
        if answer.ok:
            expect[answer.job_id] = {"succeeded", "cancelled"}
    result = run.check(wait_s=150, expect=expect)
    run.assert_clean(result)
    assert result.count("lost") == 0 and result.count("duplicated") == 0
    lapsed = run.cluster.query("SELECT count(*) FROM taskline.job_events WHERE event = 'lapsed'")
    assert lapsed[0][0] > 0  # the load outran the workers: some jobs lapsed
