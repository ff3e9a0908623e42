"""Server faults under load: the private Redis killed and restarted empty, flushed, frozen; the
private PostgreSQL stopped and crashed, once in the middle of a batch's COPY. Each scenario runs
a real cluster on fresh servers with producers enqueuing through the API the whole time, and is
judged by the offline checker.

Invariant under test: Redis is disposable (whatever it loses, reconciliation rebuilds from
PostgreSQL, and nothing runs twice), and PostgreSQL's absence costs availability, never an
acknowledged job (the API answers 503 with Retry-After and accepts nothing it cannot keep),
and a batch is written whole or not at all.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter

import psycopg
import pytest

from taskline.store.bulk import COPY_MIN_JOBS
from tests.faults.workload import Answer
from tests.helpers import wait_for

pytestmark = pytest.mark.faults

WORK = "fault.work"
LOAD_LIMIT = 400
"""Enqueues `load` sends at most."""


def acked(answers: list[Answer]) -> int:
    return sum(1 for a in list(answers) if a.ok)


def wait_acked(answers: list[Answer], n: int, timeout: float = 60.0) -> None:
    wait_for(lambda: acked(answers) >= n, timeout=timeout, interval=0.05,
             message=f"{n} acknowledged enqueues")


def load(run, sleep_s: float = 0.2):
    """Two producer threads enqueuing fault.work jobs until the block ends (bounded)."""
    return run.workload.background(
        lambda i: run.workload.enqueue(WORK, {"sleep_s": sleep_s}), threads=2, limit=LOAD_LIMIT)


def executions_per_job(run) -> Counter[str]:
    with psycopg.connect(run.cluster.settings.database_url, autocommit=True) as conn:
        rows = conn.execute("SELECT job_id::text FROM fault_exec_log").fetchall()
    return Counter(job_id for (job_id,) in rows)


def answers_with(run, status: int) -> list[dict]:
    return [r for r in run.history.entries("request") if r["status"] == status]


def reconciled(run, kind: str) -> int:
    """How many ids of `kind` the reconciler restored (from its JSON log records)."""
    return sum(int((r.get("missing") or {}).get(kind, 0))
               for r in run.cluster.log_events(("maintenance",))
               if r.get("action") == "reconcile")


def assert_ran_once(run, result) -> None:
    """Every acknowledged job succeeded after exactly one execution, and no attempt was
    refused: a Redis fault must not cost a lease (PostgreSQL alone decides those)."""
    run.assert_clean(result)
    assert result.stale == 0
    assert result.count("lost") == 0 and result.count("duplicated") == 0
    runs = executions_per_job(run)
    assert set(result.classes) <= set(runs)
    twice = {job_id: n for job_id, n in runs.items() if n > 1}
    assert twice == {}, f"jobs executed more than once: {twice}"


# --- Redis -------------------------------------------------------------------------------

@pytest.mark.fast
@pytest.mark.timeout(120)
def test_flushall_under_load(fault_run):
    run = fault_run("FLUSHALL under load", workers=2, concurrency=4)
    with load(run) as answers:
        wait_acked(answers, 30)
        run.nemesis.flushall()
        wait_acked(answers, 80)
    result = run.check()
    assert_ran_once(run, result)
    assert result.acknowledged >= 80
    assert reconciled(run, "queued") >= 1  # the backlog the flush erased came back


@pytest.mark.timeout(150)
def test_redis_killed_and_restarted_empty_under_load(fault_run):
    run = fault_run("Redis killed and restarted empty under load", workers=2, concurrency=4)
    with load(run) as answers:
        wait_acked(answers, 30)
        run.nemesis.kill_redis()
        down_from = acked(answers)
        wait_acked(answers, down_from + 20)  # the API keeps accepting: PostgreSQL is the truth
        run.nemesis.start_redis()
        wait_acked(answers, down_from + 60)
    result = run.check()
    assert_ran_once(run, result)
    # Workers claimed from PostgreSQL meanwhile; Redis's return itself triggered its rebuild.
    assert [r for r in run.cluster.log_events(("maintenance",))
            if r.get("action") == "rebuild" and "missing" in r]


@pytest.mark.timeout(240)
def test_redis_frozen_for_30s(fault_run):
    run = fault_run("Redis frozen (SIGSTOP) for 30 s", workers=2, concurrency=4)
    with load(run) as answers:
        wait_acked(answers, 30)
        with run.nemesis.frozen("redis", 30.0):
            pass
        thawed_at = acked(answers)
        # The API's breaker skips pushes while Redis is frozen, so the producers may have
        # sent their whole load (LOAD_LIMIT) before the thaw.
        wait_acked(answers, min(thawed_at + 40, LOAD_LIMIT))
    result = run.check(wait_s=90)
    assert_ran_once(run, result)


# --- PostgreSQL --------------------------------------------------------------------------

def postgres_outage(run, answers: list[Answer], seconds: float, *, crash: bool) -> None:
    """Take PostgreSQL away under load for `seconds` (stopped, or its postmaster killed)."""
    wait_acked(answers, 30)
    if crash:
        run.nemesis.crash_postgres()
    else:
        run.nemesis.stop_postgres()
    until = time.monotonic() + seconds
    # The producers keep trying meanwhile: the API must refuse with 503 + Retry-After.
    wait_for(lambda: len(answers_with(run, 503)) >= 3, timeout=seconds + 10, interval=0.1,
             message="503 answers while PostgreSQL is down")
    time.sleep(max(until - time.monotonic(), 0.0))  # the outage lasts what the scenario says
    run.nemesis.start_postgres()
    back_at = acked(answers)
    wait_acked(answers, back_at + 30)


def assert_outage_answers(run) -> None:
    unavailable = answers_with(run, 503)
    assert unavailable and all(r["retry_after"] and r["json"] for r in unavailable)
    assert answers_with(run, 500) == []


@pytest.mark.parametrize("seconds", [
    pytest.param(6.0, marks=[pytest.mark.fast, pytest.mark.timeout(150)], id="6s"),
    pytest.param(30.0, marks=pytest.mark.timeout(240), id="30s"),
])
def test_postgres_stopped_under_producer_load(fault_run, seconds: float):
    run = fault_run(f"PostgreSQL stopped for {seconds:g} s under producer load", workers=2,
                    concurrency=4)
    with load(run) as answers:
        postgres_outage(run, answers, seconds, crash=False)
    result = run.check(wait_s=90)
    run.assert_clean(result)
    assert_outage_answers(run)
    assert result.count("lost") == 0 and result.count("duplicated") == 0


@pytest.mark.timeout(180)
def test_postgres_postmaster_sigkill(fault_run):
    run = fault_run("PostgreSQL postmaster SIGKILL", workers=2, concurrency=4)
    with load(run) as answers:
        postgres_outage(run, answers, 3.0, crash=True)
    result = run.check(wait_s=90)
    run.assert_clean(result)
    assert_outage_answers(run)
    assert result.count("lost") == 0 and result.count("duplicated") == 0


BULK = 2 * COPY_MIN_JOBS


def bulk_load(run, tags: list[str]):
    """Two producer threads sending batches of BULK jobs without keys (the COPY path), each
    batch once and tagged in its payloads, pausing after a refusal (bounded)."""
    def send(i: int) -> Answer:
        tag = str(uuid.uuid4())
        tags.append(tag)
        answer = run.workload.enqueue_batch_once(
            [{"type": WORK, "payload": {"batch": tag, "i": n}} for n in range(BULK)])
        if not answer.ok:
            time.sleep(0.1)
        return answer
    return run.workload.background(send, threads=2, limit=60)


def crash_postgres_mid_copy(run) -> None:
    """SIGKILL the postmaster as soon as a COPY into taskline.jobs is running, so that the crash
    lands inside a batch's transaction rather than between two."""
    with psycopg.connect(run.cluster.settings.database_url, autocommit=True) as conn:
        wait_for(lambda: conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
            "AND query LIKE 'COPY taskline.jobs %%'").fetchone()[0] > 0,
            timeout=20, interval=0.001, message="a COPY into taskline.jobs")
    run.nemesis.crash_postgres()


@pytest.mark.fast
@pytest.mark.timeout(180)
def test_postgres_killed_mid_copy_of_bulk_enqueues(fault_run):
    """The postmaster SIGKILLed while a batch streams in by COPY: an acknowledged batch runs
    whole and once, and every batch is in PostgreSQL whole or not at all, whatever answer its
    client got (a lost answer of a keyless batch may hide a commit: it cannot be retried)."""
    run = fault_run("PostgreSQL SIGKILL mid-COPY of bulk enqueues", workers=2, concurrency=8)
    tags: list[str] = []
    with bulk_load(run, tags) as answers:
        wait_acked(answers, 3)
        crash_postgres_mid_copy(run)
        wait_for(lambda: len(answers_with(run, 503)) >= 2, timeout=20, interval=0.1,
                 message="503 answers while PostgreSQL is down")
        run.nemesis.start_postgres()
        back_at = acked(answers)
        wait_acked(answers, back_at + 3)
    result = run.check(wait_s=120)
    run.assert_clean(result)
    assert_outage_answers(run)
    assert result.count("lost") == 0 and result.count("duplicated") == 0
    assert result.acknowledged == BULK * acked(answers)
    sizes = dict(run.cluster.query("SELECT payload->>'batch', count(*) FROM taskline.jobs "
                                   "GROUP BY 1"))
    assert set(sizes) <= set(tags) and set(sizes.values()) == {BULK}, "a batch written in part"
    acknowledged = {a.body["jobs"][0]["job"]["payload"]["batch"] for a in answers if a.ok}
    assert acknowledged <= set(sizes), "an acknowledged batch is missing"


