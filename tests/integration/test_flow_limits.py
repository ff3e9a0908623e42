"""Flow limits against real PostgreSQL: the budgeted claim starts limited jobs only within
every limit that applies (concurrency, sliding-window rate, per key), most urgent first, while
the plain claim never starts one; held jobs consume no attempt and write nothing; concurrent
claimers never exceed a budget; budget frees when leases end."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import text

from taskline import flow
from tests.helpers import enqueue, succeed

W = "w-flow"


def limit(store, scope, **fields):
    return store.put_flow_limit(flow.Limit(scope, **fields))


def held(store, n, job_type="t.slow", queue="default", **kw):
    return [enqueue(store, None, job_type, {"i": i}, queue=queue, push=False, **kw)
            for i in range(n)]


def test_plain_claim_refuses_limited_jobs_and_they_stay_untouched(store):
    limit(store, "type:t.slow", concurrency=2)
    jobs = held(store, 3)
    free = enqueue(store, None, "t.fast", push=False)
    won = store.claim_jobs([j.id for j in jobs] + [free.id], W, 30)
    assert [c.job.id for c in won] == [free.id]
    refused = {r.id: r.limited for r in store.claim_refusals([j.id for j in jobs])}
    assert refused == {j.id: True for j in jobs}
    with store.transaction() as conn:
        rows = conn.execute(text("SELECT attempts, (SELECT count(*) FROM taskline.job_events e "
                                 "WHERE e.job_id = j.id) AS events FROM taskline.jobs j "
                                 "WHERE id = ANY(:ids)"), {"ids": [j.id for j in jobs]}).all()
    assert [(r.attempts, r.events) for r in rows] == [(0, 1)] * 3  # only `enqueued`


def test_concurrency_budget_starts_most_urgent_first_and_frees_on_lease_end(store):
    limit(store, "type:t.slow", concurrency=2)
    low = held(store, 2, priority=2)
    high = held(store, 2, priority=8)
    first = store.claim_held(["default"], 10, W, 30)
    assert [c.job.id for c in first.claimed] == [high[0].id, high[1].id]
    assert first.held and store.claim_held(["default"], 10, W, 30).claimed == []
    succeed(store, first.claimed[0].lease_id, W)
    again = store.claim_held(["default"], 10, W, 30)
    assert [c.job.id for c in again.claimed] == [low[0].id]


def test_a_job_needs_budget_from_its_type_and_its_queue(store):
    limit(store, "type:t.slow", concurrency=5)
    limit(store, "queue:reports", concurrency=1)
    jobs = held(store, 3, queue="reports")
    other = held(store, 2, queue="default")
    got = store.claim_held(["reports", "default"], 10, W, 30).claimed
    assert sorted(str(c.job.id) for c in got) == sorted(
        [str(jobs[0].id), str(other[0].id), str(other[1].id)])


def test_rate_limit_counts_a_sliding_window(store):
    limit(store, "type:t.slow", rate_limit=3, period_s=0.5)
    held(store, 8)
    first = store.claim_held(["default"], 10, W, 30)
    assert len(first.claimed) == 3 and first.frees_at is not None
    assert store.claim_held(["default"], 10, W, 30).claimed == []
    time.sleep(first.frees_in_s() + 0.05)
    assert len(store.claim_held(["default"], 10, W, 30).claimed) == 3


def test_per_key_gives_every_tenant_its_own_budget(store):
    limit(store, "type:t.slow", concurrency=2, per_key=True)
    a = held(store, 50, limit_key="tenant-a")
    b = held(store, 3, limit_key="tenant-b")
    shared = held(store, 3)
    got = store.claim_held(["default"], 8, W, 30).claimed
    keys = [c.job.limit_key for c in got]
    assert keys.count("tenant-a") == 2 and keys.count("tenant-b") == 2 and keys.count(None) == 2
    assert [c.job.id for c in got if c.job.limit_key == "tenant-a"] == [a[0].id, a[1].id]
    assert {c.job.id for c in got} >= {b[0].id, b[1].id, shared[0].id, shared[1].id}


def test_concurrent_claimers_never_exceed_the_budget(store):
    limit(store, "type:t.slow", concurrency=7)
    held(store, 60)
    got: list = []
    lock = threading.Lock()

    def claimer(n: int) -> None:
        for _ in range(5):
            claimed = store.claim_held(["default"], 3, f"w{n}", 30).claimed
            with lock:
                got.extend(claimed)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 7
    assert len({c.job.id for c in got}) == 7


def test_removing_a_limit_lets_its_jobs_go_back_to_redis(store):
    limit(store, "type:t.slow", concurrency=1)
    jobs = held(store, 3)
    assert store.released_of_scope("type:t.slow", 10, None) == []
    store.delete_flow_limit("type:t.slow")
    page = store.released_of_scope("type:t.slow", 2, None)
    assert [r.id for r in page] == [jobs[0].id, jobs[1].id]
    last = page[-1]
    rest = store.released_of_scope("type:t.slow", 2, (last.priority, last.created_at, last.id))
    assert [r.id for r in rest] == [jobs[2].id]


@pytest.mark.parametrize("scope", ["type:x", "queue:q"])
def test_listing_shows_use_and_held_jobs(store, scope):
    kind, name = scope.split(":")
    limit(store, scope, concurrency=1, rate_limit=10, period_s=60)
    held(store, 3, **({"job_type": name} if kind == "type" else {"queue": name}))
    queues = ["default"] if kind == "type" else [name]
    assert len(store.claim_held(queues, 5, W, 30).claimed) == 1
    (row,) = store.list_flow_limits()
    assert (row["scope"], row["running"], row["started"], row["held"]) == (scope, 1, 1, 2)
