"""The worker loop against real PostgreSQL and Redis: strict priority and FIFO order, one run
per job however often its id is pushed, attempts counted at claim, idle pickup without polling,
and fetched-but-unclaimed ids given back."""

from __future__ import annotations

import collections
import time

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import text

from taskline.dispatch.keys import QueueKeys
from tests.helpers import enqueue, wait_for
from tests.integration import worker_handlers as th
from tests.integration.worker_handlers import running_worker

Q = QueueKeys("default")


pytestmark = pytest.mark.usefixtures("clean_handlers")


def statuses(store, jobs) -> list[str]:
    return [store.get_job(j.id).status.value for j in jobs]


def all_status(store, jobs, status: str) -> bool:
    return all(s == status for s in statuses(store, jobs))


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_priorities_run_strictly_most_urgent_first(settings, store, dispatcher):
    for tag, priority in [("low-1", 2), ("low-2", 2), ("high-1", 7), ("critical", 9),
                          ("high-2", 7), ("normal", 5), ("lowest", 0)]:
        enqueue(store, dispatcher, "t.record", {"tag": tag}, priority=priority)
    with running_worker(settings, concurrency=1):
        wait_for(lambda: len(th.tags()) == 7, message="7 jobs run")
    assert th.tags() == ["critical", "high-1", "high-2", "normal", "low-1", "low-2", "lowest"]


def test_jobs_of_one_priority_run_first_in_first_out(settings, store, dispatcher):
    expected = [f"job-{i}" for i in range(12)]
    for tag in expected:
        enqueue(store, dispatcher, "t.record", {"tag": tag})
    with running_worker(settings, concurrency=1):
        wait_for(lambda: len(th.tags()) == 12, message="12 jobs run")
    assert th.tags() == expected


def test_each_job_runs_once_although_its_id_is_pushed_twice(settings, store, dispatcher):
    jobs = [enqueue(store, dispatcher, "t.record", {"tag": str(i)}, push=False)
            for i in range(20)]
    dispatcher.push([("default", 5, str(j.id)) for j in jobs] * 2)
    conflicts = sample("job_claim_conflicts_total", queue="default")
    with running_worker(settings, concurrency=4) as a, running_worker(settings, concurrency=4) as b:
        wait_for(lambda: all_status(store, jobs, "succeeded"), message="all succeeded")
        keys = [Q.ready(5), Q.processing(a.worker_id), Q.processing(b.worker_id)]
        wait_for(lambda: sum(dispatcher.client.llen(k) for k in keys) == 0,
                 message="every copy consumed")
    assert collections.Counter(th.tags()) == {str(i): 1 for i in range(20)}
    assert sample("job_claim_conflicts_total", queue="default") - conflicts == 20
    with store.engine.connect() as conn:
        leases = conn.execute(text("SELECT job_id, count(*) FROM taskline.job_leases GROUP BY "
                                   "job_id"))
        assert {row[1] for row in leases} == {1}
    assert {store.get_job(j.id).attempts for j in jobs} == {1}


def test_attempts_are_counted_at_claim(settings, store, dispatcher):
    job = enqueue(store, dispatcher, "t.block", {"gate": "g"})
    with running_worker(settings) as worker:
        wait_for(lambda: store.get_job(job.id).status.value == "running", message="running")
        assert store.get_job(job.id).attempts == 1
        events, leases = store.get_history(job.id)
        assert [e["event"] for e in events] == ["enqueued", "claimed"]
        assert len(leases) == 1 and leases[0]["attempt"] == 1
        assert leases[0]["worker_id"] == worker.worker_id and leases[0]["released_at"] is None
        th.release("g")
        wait_for(lambda: store.get_job(job.id).status.value == "succeeded", message="success")
    done = store.get_job(job.id)
    assert done.attempts == 1 and done.result == {"released": True}
    _, leases = store.get_history(job.id)
    assert [lease["outcome"] for lease in leases] == ["succeeded"]


def test_an_idle_worker_picks_up_a_pushed_job_at_once(settings, store, dispatcher):
    db = dispatcher.client.connection_pool.connection_kwargs.get("db", 0)

    def blocked_in_redis() -> bool:
        return any(c.get("cmd") == "blpop" and str(c.get("db")) == str(db)
                   for c in dispatcher.client.client_list())

    # A 30 s block: a worker that slept between polls would miss the 5 s bound below, which is
    # generous so a loaded machine cannot fail it; the benchmark measures the real latency.
    errors = sample("taskline_loop_errors_total", loop="fetch")
    with running_worker(settings, block_timeout_s=30.0):
        wait_for(blocked_in_redis, message="worker blocked in BLPOP")
        job = enqueue(store, dispatcher, "echo", {"hello": "world"})
        pushed = time.monotonic()
        wait_for(lambda: store.get_job(job.id).status.value == "succeeded", timeout=5.0,
                 interval=0.01, message="job done within 5 s of its push")
        assert time.monotonic() - pushed < 5.0
    assert store.get_job(job.id).result == {"hello": "world"}
    # Taken by the fetch that rides on the wake, not by a recovery after a failed turn.
    assert sample("taskline_loop_errors_total", loop="fetch") == errors
    _, leases = store.get_history(job.id)
    assert [lease["outcome"] for lease in leases] == ["succeeded"]


def test_unclaimed_ids_in_the_processing_list_go_back_at_shutdown(settings, store, dispatcher):
    queued = enqueue(store, dispatcher, "echo", priority=7, push=False)
    finished = enqueue(store, dispatcher, "echo", priority=3, push=False)
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE taskline.jobs SET status = 'succeeded' WHERE id = :id"),
                     {"id": finished.id})
    with running_worker(settings) as worker:
        processing = Q.processing(worker.worker_id)
        dispatcher.client.lpush(processing, str(queued.id), str(finished.id))
    assert dispatcher.client.llen(processing) == 0
    assert dispatcher.client.lrange(Q.ready(7), 0, -1) == [str(queued.id)]
    assert dispatcher.client.llen(Q.ready(3)) == 0
    assert store.get_job(queued.id).status.value == "queued"


def test_the_workers_connections_run_generic_plans(settings, store, dispatcher):
    """Every statement a worker prepares runs one plan, made once (store.make_engine's
    generic_plans): its claims and settles find rows by ids and literal states."""
    enqueue(store, dispatcher, "t.record", {"tag": "planned"})
    with running_worker(settings, concurrency=1) as worker:
        wait_for(lambda: th.tags() == ["planned"], message="the job run")
        with worker.store.engine.connect() as conn:
            mode = conn.execute(text("SHOW plan_cache_mode")).scalar()
    assert mode == "force_generic_plan"
