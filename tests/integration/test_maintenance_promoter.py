"""The promoter against real PostgreSQL and Redis: due retries and delayed jobs become ready
(and leave their sets), future ones wait; a crash between the commit and the push is repaired
by the reconciler."""

from __future__ import annotations

import uuid

from sqlalchemy import text

from taskline.dispatch.dispatcher import Dispatcher
from taskline.dispatch.keys import QueueKeys
from taskline.jobs import Job
from taskline.store.store import Store
from taskline_maintenance.promoter import Promoter
from taskline_maintenance.reconciler import Reconciler
from tests.helpers import enqueue, fail

KEYS = QueueKeys("default")


def retrying(store: Store, dispatcher: Dispatcher, delay_s: float, priority: int = 5) -> Job:
    """A job whose first attempt failed and waits `delay_s` for its retry, as a worker does it."""
    job = enqueue(store, dispatcher, priority=priority)
    dispatcher.fetch("default", "w1", 1)
    (claimed,) = store.claim_jobs([job.id], "w1", 15)
    row = fail(store, claimed.lease_id, "w1", delay_s=delay_s)
    dispatcher.retry_later("default", "w1", str(job.id), row.due_ms)
    return job


def delayed(store: Store, dispatcher: Dispatcher, delay_s: float, priority: int = 5) -> Job:
    """A job accepted with a delay, as the producer stores and schedules it."""
    with store.transaction() as conn:
        job = store.insert_job(conn, id=uuid.uuid4(), type="echo", queue="default", payload={},
                               priority=priority, status="scheduled", max_retries=3,
                               timeout_s=30.0, idempotency_key=None, request_hash=None,
                               delay_s=delay_s)
    due_ms = int(job.next_run_at.timestamp() * 1000)
    dispatcher.schedule("default", str(job.id), due_ms)
    return job


def backdate(store: Store) -> None:
    """Age every row past the reconciler's grace, as if the crash happened a while ago."""
    with store.transaction() as conn:
        conn.execute(text("UPDATE taskline.jobs SET updated_at = updated_at - interval '1 minute'"))


def test_due_retries_and_delayed_jobs_are_promoted_future_ones_wait(store, dispatcher,
                                                                    settings):
    retry = retrying(store, dispatcher, delay_s=0, priority=8)
    due = delayed(store, dispatcher, delay_s=0, priority=3)
    future = delayed(store, dispatcher, delay_s=3600)

    result = Promoter(store, dispatcher, settings).run_once()

    assert result.promoted == 2
    assert dispatcher.list_range(KEYS.ready(8), 0, -1) == [str(retry.id)]
    assert dispatcher.list_range(KEYS.ready(3), 0, -1) == [str(due.id)]
    assert dispatcher.client.zrange(KEYS.retry, 0, -1) == []
    assert dispatcher.client.zrange(KEYS.scheduled, 0, -1) == [str(future.id)]
    assert store.get_job(retry.id).status == "queued"
    assert store.get_job(due.id).status == "queued"
    assert store.get_job(future.id).status == "scheduled"
    events, _ = store.get_history(due.id)
    assert events[-1]["event"] == "promoted"
    assert Promoter(store, dispatcher, settings).run_once().promoted == 0


def test_promotion_pages_through_many_due_jobs(store, dispatcher, settings):
    jobs = [delayed(store, dispatcher, delay_s=0) for _ in range(7)]

    result = Promoter(store, dispatcher, settings, page_size=3).run_once()

    assert result.promoted == 7
    assert sorted(dispatcher.list_range(KEYS.ready(5), 0, -1)) == sorted(str(j.id) for j in jobs)


def test_a_crash_between_commit_and_push_is_repaired_by_the_reconciler(store, dispatcher,
                                                                       settings):
    retry = retrying(store, dispatcher, delay_s=0, priority=8)
    due = delayed(store, dispatcher, delay_s=0, priority=2)
    assert len(store.promote_due(100)) == 2  # committed; the process dies before the push
    assert all(dispatcher.list_range(k, 0, -1) == [] for k in KEYS.ready_by_urgency)
    backdate(store)

    result = Reconciler(store, dispatcher, settings).run_once()

    assert result.missing == {"queued": 2}
    assert result.corrupted == {"retry": 1, "scheduled": 1}
    assert dispatcher.list_range(KEYS.ready(8), 0, -1) == [str(retry.id)]
    assert dispatcher.list_range(KEYS.ready(2), 0, -1) == [str(due.id)]
    assert dispatcher.client.zcard(KEYS.retry) == 0
    assert dispatcher.client.zcard(KEYS.scheduled) == 0
    assert Promoter(store, dispatcher, settings).run_once().promoted == 0
