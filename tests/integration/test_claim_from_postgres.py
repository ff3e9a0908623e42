"""The claim PostgreSQL makes when Redis is unreachable (`Store.claim_due_jobs`): the same claim
as for ids fetched from Redis, with candidates chosen by PostgreSQL: queues in the given order,
most urgent first, FIFO within a priority, each job won by one claimer only, and the plan reads
the claim index rather than the queued jobs."""

from __future__ import annotations

import threading

from sqlalchemy import text

from taskline import flow
from taskline.store.store import Store
from tests.helpers import enqueue


def test_the_most_urgent_job_is_claimed_first_and_fifo_within_a_priority(store: Store, dispatcher):
    low = enqueue(store, dispatcher, push=False, priority=2)
    first = enqueue(store, dispatcher, push=False, priority=7)
    second = enqueue(store, dispatcher, push=False, priority=7)
    urgent = enqueue(store, dispatcher, push=False, priority=9)
    claimed = store.claim_due_jobs(["default"], 10, "w1", 15)
    assert [c.job.id for c in claimed] == [urgent.id, first.id, second.id, low.id]
    assert all(c.job.status == "running" and c.job.attempts == 1 for c in claimed)


def test_the_claim_writes_the_lease_and_event_of_a_redis_claim(store: Store, dispatcher):
    job = enqueue(store, dispatcher, push=False)
    (claimed,) = store.claim_due_jobs(["default"], 5, "w1", 15)
    assert claimed.job.id == job.id
    with store.transaction() as conn:
        lease = conn.execute(text("SELECT worker_id, attempt FROM taskline.live_leases WHERE "
                                  "id = :id"),
                             {"id": claimed.lease_id}).one()
        events = conn.execute(text("SELECT event FROM taskline.job_events WHERE job_id = :id "
                                   "ORDER BY id"),
                              {"id": job.id}).scalars().all()
    assert tuple(lease) == ("w1", 1)
    assert events == ["enqueued", "claimed"]
    # Its id, fetched later from a ready list, is refused by the Redis path's claim.
    assert store.claim_jobs([job.id], "w2", 15) == []
    assert store.claim_due_jobs(["default"], 5, "w2", 15) == []


def test_queues_are_filtered_and_taken_in_the_order_given(store: Store, dispatcher):
    mail = [enqueue(store, dispatcher, push=False, queue="mail") for _ in range(2)]
    bulk = enqueue(store, dispatcher, push=False, queue="bulk", priority=9)
    other = enqueue(store, dispatcher, push=False, queue="other", priority=9)
    claimed = store.claim_due_jobs(["mail", "bulk"], 3, "w1", 15)
    assert [c.job.id for c in claimed] == [mail[0].id, mail[1].id, bulk.id]
    assert store.get_job(other.id).status == "queued"


def test_the_limit_bounds_the_claim(store: Store, dispatcher):
    jobs = [enqueue(store, dispatcher, push=False) for _ in range(5)]
    claimed = store.claim_due_jobs(["default"], 2, "w1", 15)
    assert [c.job.id for c in claimed] == [jobs[0].id, jobs[1].id]


def test_only_queued_jobs_are_claimed(store: Store, dispatcher):
    delayed = enqueue(store, dispatcher, push=False)
    with store.transaction() as conn:  # a delayed first run, not due yet
        conn.execute(text("UPDATE taskline.jobs SET status = 'scheduled', next_run_at = now() + "
                          "interval '1 minute' WHERE id = :id"), {"id": delayed.id})
    running = enqueue(store, dispatcher, push=False)
    store.claim_jobs([running.id], "w0", 15)
    assert store.claim_due_jobs(["default"], 10, "w1", 15) == []
    assert store.get_job(delayed.id).status == "scheduled"


def test_concurrent_claimers_each_win_different_jobs(store: Store, dispatcher):
    ids = {enqueue(store, dispatcher, push=False).id for _ in range(60)}
    wins: dict[str, list] = {}
    barrier = threading.Barrier(6)

    def race(worker: str) -> None:
        barrier.wait()
        won = []
        while batch := store.claim_due_jobs(["default"], 4, worker, 15):
            won += [c.job.id for c in batch]
        wins[worker] = won

    threads = [threading.Thread(target=race, args=(f"w{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [i for won in wins.values() for i in won]
    assert sorted(every) == sorted(ids) and len(every) == len(set(every))
    with store.transaction() as conn:
        assert conn.execute(text("SELECT sum(attempts) FROM taskline.jobs")).scalar_one() == 60


def test_a_locked_candidate_is_skipped_not_waited_for(store: Store, dispatcher):
    first = enqueue(store, dispatcher, push=False)
    second = enqueue(store, dispatcher, push=False)
    with store.engine.connect() as other:
        other.execute(text("SELECT id FROM taskline.jobs WHERE id = :id FOR UPDATE"),
                      {"id": first.id})
        claimed = store.claim_due_jobs(["default"], 2, "w1", 15)
        other.rollback()
    assert [c.job.id for c in claimed] == [second.id]
    assert store.get_job(first.id).status == "queued"


def test_a_paused_queue_yields_nothing_and_the_next_queue_is_claimed(store: Store, dispatcher):
    held = enqueue(store, dispatcher, push=False, queue="held", priority=9)
    other = enqueue(store, dispatcher, push=False, queue="other")
    store.pause_queue("held", "op")
    claimed = store.claim_due_jobs(["held", "other"], 2, "w1", 15)
    assert [c.job.id for c in claimed] == [other.id]
    assert store.get_job(held.id).status == "queued"
    store.resume_queue("held")
    assert [c.job.id for c in store.claim_due_jobs(["held"], 2, "w1", 15)] == [held.id]


def test_limited_jobs_are_left_to_the_budgeted_claim(store: Store, dispatcher):
    limited = enqueue(store, dispatcher, "slow.api", push=False, priority=9)
    free = enqueue(store, dispatcher, push=False)
    store.put_flow_limit(flow.Limit("type:slow.api", concurrency=1))
    claimed = store.claim_due_jobs(["default"], 5, "w1", 15)
    assert [c.job.id for c in claimed] == [free.id]
    assert store.get_job(limited.id).status == "queued"
    store.put_flow_limit(flow.Limit("queue:mail", concurrency=1))
    mail = enqueue(store, dispatcher, push=False, queue="mail")
    assert store.claim_due_jobs(["mail"], 5, "w1", 15) == []
    assert store.get_job(mail.id).status == "queued"
