"""Network faults between the services and the servers, made by the suite's TCP proxies: a
worker cut off from PostgreSQL past its lease, a worker's Redis link silenced then reset, one
lost LMOVE reply, a slow PostgreSQL link, and the producer dying between its commit and its
push. Clock skew between services (libfaketime) lives here too: it is what a network of
machines does to time. Each scenario runs a real cluster on fresh servers and is judged by the
offline checker.

Invariant under test: a worker that cannot reach PostgreSQL stops its attempt before its lease
ends and takes no new work; no reply lost on the way from Redis strands a job for good; a slow
link or a skewed clock changes timing, never outcomes; and a client retrying with its
idempotency key gets the job it was promised, which runs once.
"""

from __future__ import annotations

import threading
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from tests.faults.clockskew import skewed_env
from tests.faults.nemesis import executing_jobs
from tests.faults.workload import Answer
from tests.helpers import wait_for

pytestmark = pytest.mark.faults

WORK = "fault.work"


# --- helpers ------------------------------------------------------------------------------


def enqueue_work(run, n: int, sleep_s: float = 0.0, payload_extra: dict | None = None,
                 **fields) -> list[str]:
    payload = {"sleep_s": sleep_s, **(payload_extra or {})}
    answers = run.workload.many([lambda: run.workload.enqueue(WORK, payload, **fields)] * n)
    assert all(a.ok for a in answers), [(a.status, a.body) for a in answers]
    return [a.job_id for a in answers]


def wait_succeeded(run, ids: list[str], timeout: float = 30.0) -> None:
    def done() -> bool:
        rows = run.cluster.query("SELECT count(*) FROM taskline.jobs WHERE id = ANY(%s::uuid[]) "
                                 "AND status = 'succeeded'", (ids,))
        return rows[0][0] == len(ids)
    wait_for(done, timeout=timeout, interval=0.1, message=f"{len(ids)} jobs to succeed")


def wait_executing(run, job_id: str, service) -> None:
    wait_for(lambda: job_id in executing_jobs(run.cluster).get(service.pid, []),
             timeout=15, interval=0.02, message=f"{service.name} to run {job_id}")


def executions(run, job_id: str) -> list[tuple]:
    """(attempt, pid, started_at, ended_at) of each execution of the job."""
    return run.cluster.query("SELECT attempt, pid, started_at, ended_at FROM fault_exec_log "
                             "WHERE job_id = %s ORDER BY id", (job_id,))


def lease_rows(run, job_id: str) -> list[tuple]:
    """(attempt, worker_id, leased_until, released_at, outcome) of each lease of the job."""
    return run.cluster.query("SELECT attempt, worker_id, leased_until, released_at, outcome "
                             "FROM taskline.job_leases WHERE job_id = %s ORDER BY id", (job_id,))


def executions_per_job(run) -> Counter[str]:
    rows = run.cluster.query("SELECT job_id::text FROM fault_exec_log")
    return Counter(job_id for (job_id,) in rows)


def log_actions(run, service, action: str) -> list[dict]:
    return [r for r in run.cluster.log_events(("worker", "maintenance", "api"))
            if r["_service"] == service.name and r.get("action") == action]


def acked(answers: list[Answer]) -> int:
    return sum(1 for a in list(answers) if a.ok)


def wait_acked(answers: list[Answer], n: int, timeout: float = 60.0) -> None:
    wait_for(lambda: acked(answers) >= n, timeout=timeout, interval=0.05,
             message=f"{n} acknowledged enqueues")


def load(run, sleep_s: float = 0.2, threads: int = 1, limit: int = 200):
    """Producer threads enqueuing fault.work jobs until the block ends (bounded)."""
    return run.workload.background(
        lambda i: run.workload.enqueue(WORK, {"sleep_s": sleep_s}), threads=threads,
        limit=limit)


def assert_ran_once(run, result) -> None:
    run.assert_clean(result)
    assert result.count("lost") == 0 and result.count("duplicated") == 0
    twice = {j: n for j, n in executions_per_job(run).items() if n > 1}
    assert twice == {}, f"jobs executed more than once: {twice}"


# --- worker <-> PostgreSQL ----------------------------------------------------------------

@pytest.mark.fast
@pytest.mark.timeout(120)
def test_worker_postgres_blackhole_longer_than_the_lease_self_fences(fault_run):
    run = fault_run("worker-to-PostgreSQL blackhole longer than the lease (self-fencing)",
                    workers=1, concurrency=2, proxied={("worker", "postgres")})
    cut_off = run.cluster.workers[0]
    [job_id] = enqueue_work(run, 1, sleep_s=6.0)
    wait_executing(run, job_id, cut_off)
    run.nemesis.blackhole("worker", "postgres")
    cut_at = datetime.now(UTC)
    # A rescuer with a direct link: the recovered job must run there, and so must new work.
    rescuer = run.cluster.add_worker(env={"DATABASE_URL": run.cluster.settings.database_url})
    during = enqueue_work(run, 4, sleep_s=0.2)
    wait_succeeded(run, [job_id, *during])
    wait_for(lambda: log_actions(run, cut_off, "self_fence"), timeout=10,
             message="the cut-off worker to fence itself")
    run.nemesis.unblackhole("worker", "postgres")
    healed_at = datetime.now(UTC)
    # Once PostgreSQL answers again the cut-off worker takes work again.
    after = enqueue_work(run, 8, sleep_s=0.5)
    wait_for(lambda: any(pid == cut_off.pid for j in after for _, pid, _, _ in
                         executions(run, j)), timeout=30, message="the healed worker to work")
    result = run.check()
    run.assert_clean(result)

    first, second = executions(run, job_id)
    lost, won = lease_rows(run, job_id)
    assert first[1] == cut_off.pid and second[1] == rescuer.pid
    assert lost[4] == "lost" and won[4] == "succeeded" and won[0] == 2
    # Self-fencing: the attempt stopped before its lease ran out, so no two ran at once.
    assert first[3] is not None and first[3] <= lost[2], (first, lost)
    assert second[2] >= lost[2]
    starts_while_cut = [s for j in during for _, pid, s, _ in executions(run, j)
                        if pid == cut_off.pid and cut_at <= s <= healed_at]
    assert starts_while_cut == []
    assert result.stale >= 1


# --- worker <-> Redis ---------------------------------------------------------------------

@pytest.mark.timeout(150)
def test_worker_redis_blackhole_then_reset(fault_run):
    run = fault_run("worker-to-Redis blackhole, then reset", workers=2, concurrency=2,
                    proxied={("worker", "redis")})
    with load(run) as answers:
        wait_acked(answers, 20)
        run.nemesis.blackhole("worker", "redis")
        cut_from = acked(answers)
        # Longer than the workers' Redis socket timeout: every worker claims from PostgreSQL.
        wait_for(lambda: all(log_actions(run, w, "dispatch_mode") for w in run.cluster.workers),
                 timeout=20, message="every worker to notice Redis is gone")
        wait_acked(answers, cut_from + 20)  # the API still accepts: its own link is fine
        assert run.nemesis.reset("worker", "redis") >= 1
        run.nemesis.unblackhole("worker", "redis")
        wait_acked(answers, cut_from + 60)
    result = run.check()
    assert_ran_once(run, result)
    assert result.stale == 0  # a silent Redis costs no lease: PostgreSQL alone decides those


@pytest.mark.fast
@pytest.mark.timeout(90)
def test_lost_lmove_reply_strands_an_id_that_reconciliation_returns(fault_run):
    run = fault_run("lost LMOVE reply (stranded id returned by reconciliation)", workers=1,
                    concurrency=2, proxied={("worker", "redis")})
    # A delayed job: its id is known before any worker can take it, so the fetch that moves
    # it is the reply we drop.
    answer = run.workload.enqueue(WORK, {"sleep_s": 0.1}, delay_s=1.0)
    assert answer.ok, answer
    job_id = answer.job_id
    run.nemesis.swallow_reply("worker", "redis", containing=job_id.encode())
    wait_succeeded(run, [job_id], timeout=40)
    proxy = run.cluster.proxy("worker", "redis")
    assert proxy.swallowed == 1
    maintenance = run.cluster.maintenances[0]
    returned = [r for r in log_actions(run, maintenance, "reconcile")
                if r.get("job_id") == job_id]
    assert returned, "the reconciler did not return the stranded id"
    more = enqueue_work(run, 4, sleep_s=0.1)
    result = run.check()
    assert_ran_once(run, result)
    assert result.acknowledged == 1 + len(more)
    assert [row[0] for row in lease_rows(run, job_id)] == [1]  # claimed once, run once


@pytest.mark.timeout(240)
def test_two_seconds_of_latency_on_the_postgres_link(fault_run):
    """1 s each way, so 2 s per round trip, with production's lease (15 s, renewed every
    5 s): slow is not dead, so no lease may be taken from a live worker."""
    run = fault_run("2 s round-trip latency on the worker-to-PostgreSQL link", workers=2,
                    concurrency=4, proxied={("worker", "postgres")},
                    settings={"lease_s": 15.0, "heartbeat_s": 5.0})
    run.nemesis.latency("worker", "postgres", 1.0)
    ids = enqueue_work(run, 6, sleep_s=1.0) + enqueue_work(run, 2, sleep_s=20.0)
    wait_succeeded(run, ids, timeout=150)
    run.nemesis.latency("worker", "postgres", 0.0)
    result = run.check()
    assert_ran_once(run, result)
    recovered = run.cluster.query("SELECT count(*) FROM taskline.job_events WHERE event = "
                                  "'recovered'")
    assert recovered[0][0] == 0
    assert result.stale == 0


# --- clocks -------------------------------------------------------------------------------

@pytest.mark.timeout(150)
def test_clock_skew_between_worker_and_maintenance(fault_run, tmp_path):
    started_from = datetime.now(UTC)
    run = fault_run("clock skew: worker -30 s, maintenance +30 s", workers=2, concurrency=2,
                    env={"worker": skewed_env("-30s", tmp_path),
                         "maintenance": skewed_env("+30s", tmp_path)})
    started_by = datetime.now(UTC)
    for kind, offset in (("worker", "-30s"), ("maintenance", "+30s")):
        run.nemesis.fault("clock_skew", kind, offset=offset)
    long = enqueue_work(run, 2, sleep_s=5.0)  # outlive the 2 s lease several times
    flaky = enqueue_work(run, 3, sleep_s=0.1, payload_extra={"fail_first": 1})
    delayed = enqueue_work(run, 3, sleep_s=0.1, delay_s=2.0)
    plain = enqueue_work(run, 10, sleep_s=0.1)
    result = run.check()
    run.assert_clean(result)
    assert result.count("lost") == 0 and result.count("duplicated") == 0
    attempts = dict(run.cluster.query("SELECT id::text, attempts FROM taskline.jobs"))
    assert all(attempts[j] == 1 for j in long + delayed + plain), attempts
    assert all(attempts[j] == 2 for j in flaky), attempts
    recovered = run.cluster.query("SELECT count(*) FROM taskline.job_events WHERE event = "
                                  "'recovered'")
    assert recovered[0][0] == 0  # neither clock made a live lease look expired
    for job_id in delayed:  # due by PostgreSQL's clock: neither 30 s early nor 30 s late
        [(waited,)] = run.cluster.query("SELECT extract(epoch FROM l.leased_at - j.created_at) "
                                        "FROM taskline.jobs j JOIN taskline.job_leases l ON "
                                        "l.job_id = j.id "
                                        "WHERE j.id = %s", (job_id,))
        assert 1.9 <= float(waited) < 15, waited
    # The skew was real: each service stamped its start-up log line with its own clock.
    assert first_log_time(run, run.cluster.workers[0]) <= started_by - timedelta(seconds=25)
    assert first_log_time(run, run.cluster.maintenances[0]) >= started_from + timedelta(
        seconds=25)


def first_log_time(run, service) -> datetime:
    record = next(r for r in run.cluster.log_events((service.kind,))
                  if r["_service"] == service.name)
    return datetime.fromisoformat(record["ts"].replace("Z", "+00:00"))


# --- the producer -------------------------------------------------------------------------

@pytest.mark.fast
@pytest.mark.timeout(120)
def test_producer_crash_between_commit_and_push(fault_run):
    run = fault_run("producer crash between commit and push; client retries its key",
                    workers=1, concurrency=2, proxied={("api", "redis")})
    run.nemesis.blackhole("api", "redis")  # the push after the commit will hang
    answers: list[Answer] = []
    client = threading.Thread(
        target=lambda: answers.append(run.workload.enqueue(WORK, {"sleep_s": 0.1})))
    client.start()
    wait_for(lambda: run.cluster.query("SELECT id::text FROM taskline.jobs"), timeout=15,
             message="the job to be committed")
    [(job_id,)] = run.cluster.query("SELECT id::text FROM taskline.jobs")
    run.nemesis.kill(run.cluster.api)  # committed, not pushed, not answered
    run.nemesis.unblackhole("api", "redis")
    run.nemesis.restart(run.cluster.api)
    client.join(60)
    [answer] = answers
    assert answer.ok and answer.status == 200 and answer.job_id == job_id, answer
    assert answer.tries >= 2
    wait_succeeded(run, [job_id], timeout=30)
    result = run.check()
    assert_ran_once(run, result)
    assert result.acknowledged == 1
    assert len(run.cluster.query("SELECT 1 FROM taskline.jobs")) == 1
