"""State faults and races: Redis holding what PostgreSQL does not say (duplicate, unknown and
garbage ids, a queued row with no Redis entry) and clients racing the engine (cancel against
claim, concurrent requeues of one dead job). Each scenario runs a real cluster on fresh private
servers and is judged by the offline checker.

Invariant under test: PostgreSQL's conditional claim admits one winner per attempt, so whatever
Redis holds, a job runs at most once per attempt and commits its effect once; reconciliation
removes what PostgreSQL does not back and restores what it lost.
"""

from __future__ import annotations

import uuid
from collections import Counter

import pytest

from taskline.dispatch.keys import QueueKeys
from tests.faults.checker import TERMINAL
from tests.helpers import enqueue, wait_for

pytestmark = pytest.mark.faults

WORK = "fault.work"
Q = QueueKeys("default")


def enqueue_work(run, n: int, payload: dict | None = None, **fields) -> list[str]:
    answers = run.workload.many([lambda: run.workload.enqueue(WORK, payload or {}, **fields)] * n)
    assert all(a.ok for a in answers), [(a.status, a.body) for a in answers]
    return [a.job_id for a in answers]


def executions_per_job(run) -> Counter:
    return Counter(dict(run.cluster.query("SELECT job_id::text, count(*) FROM fault_exec_log "
                                          "GROUP BY job_id")))


def ready_ids(run) -> list[str]:
    client = run.cluster.dispatcher.client
    return [i for key in Q.ready_by_urgency for i in client.lrange(key, 0, -1)]


@pytest.mark.timeout(90)
def test_one_id_pushed_into_two_lists_and_twice_into_one(fault_run):
    run = fault_run("one id in two lists and twice in one", workers=0)
    ids = enqueue_work(run, 20)
    run.nemesis.push_ids(Q.ready(9), ids)  # a second list
    run.nemesis.push_ids(Q.ready(5), ids)  # the same list again
    run.nemesis.push_ids(Q.ready(5), ids)
    assert Counter(ready_ids(run)) == dict.fromkeys(ids, 4)
    for _ in range(2):
        run.cluster.add_worker(concurrency=4)
    result = run.check()
    run.assert_clean(result)
    assert result.acknowledged == 20 and result.count("ok") == 20
    assert executions_per_job(run) == dict.fromkeys(ids, 1)


@pytest.mark.timeout(90)
def test_unknown_ids_pushed_into_a_ready_list(fault_run):
    run = fault_run("unknown id pushed into a ready list", workers=0)
    unknown = [str(uuid.uuid4()) for _ in range(5)] + ["not-a-job-id"]
    run.nemesis.push_ids(Q.ready(7), unknown)
    ids = enqueue_work(run, 10)
    # With no worker to stumble on them, reconciliation alone must remove them.
    wait_for(lambda: not set(unknown) & set(ready_ids(run)), timeout=20,
             message="reconciliation to remove the unknown ids")
    assert sorted(ready_ids(run)) == sorted(ids)
    run.nemesis.push_ids(Q.ready(9), unknown)  # and now with workers taking them
    run.cluster.add_worker(concurrency=4)
    result = run.check()
    run.assert_clean(result)
    assert result.count("ok") == 10
    assert set(executions_per_job(run)) == set(ids)


@pytest.mark.timeout(90)
def test_queued_row_with_no_redis_entry(fault_run):
    run = fault_run("queued row inserted with no Redis entry", workers=1, concurrency=4)
    hidden = [str(enqueue(run.cluster.store, run.cluster.dispatcher, WORK, {}, push=False).id)
              for _ in range(10)]
    run.nemesis.fault("insert_without_push", "postgres", jobs=len(hidden))
    visible = enqueue_work(run, 10)
    result = run.check()
    run.assert_clean(result)
    assert result.count("ok") == 10

    def hidden_done() -> bool:
        return run.cluster.query("SELECT count(*) FROM taskline.jobs WHERE id = ANY(%s::uuid[]) "
                                 "AND status = 'succeeded'", (hidden,))[0][0] == len(hidden)

    # The checker waits for the acknowledged jobs only; these ran only if reconciliation
    # (every 2 s here) pushed them, and a fast worker may finish the others first.
    wait_for(hidden_done, timeout=30,
             message="reconciliation to push the rows Redis never heard of")
    assert executions_per_job(run) == dict.fromkeys(hidden + visible, 1)


@pytest.mark.timeout(150)
def test_cancel_racing_claim_500_times(fault_run):
    run = fault_run("cancel racing claim (500 races)", workers=2, concurrency=4)

    def race() -> tuple[str, int | None]:
        job = run.workload.enqueue(WORK, {})
        assert job.ok, (job.status, job.body)
        return job.job_id, run.workload.cancel(job.job_id).status

    outcomes = run.workload.many([race] * 500, threads=8)
    result = run.check(runs=500, expect={WORK: {"succeeded", "cancelled"}})
    run.assert_clean(result)
    by_answer = Counter(status for _, status in outcomes)
    assert set(by_answer) <= {200, 202, 409}, by_answer
    states = dict(run.cluster.query("SELECT id::text, status FROM taskline.jobs"))
    runs = executions_per_job(run)
    for job_id, status in outcomes:
        if status == 200:  # cancelled while pending: it must never have started
            assert states[job_id] == "cancelled" and runs[job_id] == 0, job_id
        elif status == 409:  # already finished: it ran exactly once
            assert states[job_id] == "succeeded" and runs[job_id] == 1, job_id
        else:  # running when asked to stop
            assert states[job_id] in TERMINAL and runs[job_id] == 1, job_id
    assert result.acknowledged == 500


@pytest.mark.timeout(120)
def test_retry_of_a_dead_job_racing_itself(fault_run):
    run = fault_run("retry of a dead job racing itself", workers=1, concurrency=4)
    ids = enqueue_work(run, 10, payload={"fail_executions": 1, "non_retryable": True})
    wait_for(lambda: run.cluster.query(
                 "SELECT count(*) FROM taskline.jobs WHERE status = 'dead'")[0][0] == 10,
             timeout=30, message="every job dead-lettered")
    for job_id in ids:
        answers = run.workload.many([lambda j=job_id: run.workload.retry(j)] * 16, threads=16)
        statuses = Counter(a.status for a in answers)
        assert statuses == {200: 1, 409: 15}, statuses
    result = run.check(runs=len(ids))
    run.assert_clean(result)
    assert result.count("recovered") == len(ids)  # each needed a requeue
    assert executions_per_job(run) == dict.fromkeys(ids, 2)  # one failure, one success
    effects = Counter(dict(run.cluster.query("SELECT job_id::text, count(*) FROM fault_effects "
                                             "GROUP BY job_id")))
    assert effects == dict.fromkeys(ids, 1)
