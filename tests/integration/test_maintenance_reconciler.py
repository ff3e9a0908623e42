"""The reconciler against real PostgreSQL and Redis: what Redis lost is restored into the right
structure, what PostgreSQL does not back is removed, duplicates still run once, stranded ids
go back to ready, and 100,000 pending jobs are restored in one pass."""

from __future__ import annotations

import threading
import time
import uuid

from prometheus_client import REGISTRY
from sqlalchemy import text

from taskline.dispatch.dispatcher import Dispatcher
from taskline.dispatch.keys import QUEUES_SET, QueueKeys
from taskline.jobs import Job
from taskline.store.store import Store
from taskline_maintenance.reconciler import Reconciler
from tests.helpers import enqueue, fail, succeed

DEFAULT = QueueKeys("default")
MAIL = QueueKeys("mail")


def reconciler(store: Store, dispatcher: Dispatcher, settings, **kw) -> Reconciler:
    return Reconciler(store, dispatcher, settings, strand_pause_s=0.1, **kw)


def backdate(store: Store) -> None:
    """Age every row past the grace, so a pass judges it (instead of waiting 5 s)."""
    with store.transaction() as conn:
        conn.execute(text("UPDATE taskline.jobs SET updated_at = updated_at - interval '1 minute'"))


def items(dispatcher: Dispatcher, key: str) -> list[str]:
    return dispatcher.list_range(key, 0, -1)


def all_ready(dispatcher: Dispatcher, keys: QueueKeys) -> list[str]:
    return [i for key in keys.ready_by_urgency for i in items(dispatcher, key)]


def failed(store: Store, dispatcher: Dispatcher, status: str, **kw) -> tuple[Job, int]:
    """A job whose attempt failed into `status` (retrying or dead), as a worker records it."""
    job = enqueue(store, dispatcher, push=False, **kw)
    (claimed,) = store.claim_jobs([job.id], "w1", 15)
    row = fail(store, claimed.lease_id, "w1", delay_s=600 if status == "retrying" else None)
    if status == "retrying":
        dispatcher.retry_later(job.queue, "w1", str(job.id), row.due_ms)
    else:
        dispatcher.dead_letter(job.queue, "w1", str(job.id))
    return job, row.due_ms


def delayed(store: Store, dispatcher: Dispatcher, queue: str = "default") -> Job:
    with store.transaction() as conn:
        job = store.insert_job(conn, id=uuid.uuid4(), type="echo", queue=queue, payload={},
                               priority=5, status="scheduled", max_retries=3, timeout_s=30.0,
                               idempotency_key=None, request_hash=None, delay_s=3600)
    dispatcher.schedule(queue, str(job.id), int(job.next_run_at.timestamp() * 1000))
    return job


def succeeded(store: Store, dispatcher: Dispatcher) -> Job:
    job = enqueue(store, dispatcher, push=False)
    (claimed,) = store.claim_jobs([job.id], "w1", 15)
    assert succeed(store, claimed.lease_id, "w1", "ok")
    return job


def test_after_flushdb_every_job_is_restored_where_it_belongs(store, dispatcher, settings):
    low = enqueue(store, dispatcher, priority=1)
    urgent = enqueue(store, dispatcher, queue="mail", priority=9)
    retry, due_ms = failed(store, dispatcher, "retrying", priority=6)
    later = delayed(store, dispatcher, queue="mail")
    dead, _ = failed(store, dispatcher, "dead", queue="mail", max_retries=0)
    dispatcher.client.flushdb()
    backdate(store)

    result = reconciler(store, dispatcher, settings).run_once()

    assert result.missing == {"queued": 2, "retrying": 1, "scheduled": 1, "dead": 1}
    assert result.corrupted == {}
    assert items(dispatcher, DEFAULT.ready(1)) == [str(low.id)]
    assert items(dispatcher, MAIL.ready(9)) == [str(urgent.id)]
    assert all_ready(dispatcher, DEFAULT) == [str(low.id)]
    assert all_ready(dispatcher, MAIL) == [str(urgent.id)]
    assert dispatcher.client.zrange(DEFAULT.retry, 0, -1, withscores=True) == [
        (str(retry.id), float(due_ms))]
    assert dispatcher.client.zrange(MAIL.scheduled, 0, -1) == [str(later.id)]
    assert items(dispatcher, MAIL.dlq) == [str(dead.id)]
    assert dispatcher.known_queues() == {"default", "mail"}
    assert reconciler(store, dispatcher, settings).run_once().changed is False
    assert dispatcher.client.keys("*reconcile*") == []


def test_a_row_without_a_redis_entry_is_restored_once_past_the_grace(store, dispatcher,
                                                                     settings):
    job = enqueue(store, dispatcher, push=False)  # a producer between commit and push

    assert reconciler(store, dispatcher, settings).run_once().missing == {}
    assert all_ready(dispatcher, DEFAULT) == []

    backdate(store)  # the producer died: the row stays unpushed past the grace
    assert reconciler(store, dispatcher, settings).run_once().missing == {"queued": 1}
    assert items(dispatcher, DEFAULT.ready(5)) == [str(job.id)]


def test_entries_postgresql_does_not_back_are_removed(store, dispatcher, settings):
    keep = enqueue(store, dispatcher)
    done = succeeded(store, dispatcher)
    requeued, _ = failed(store, dispatcher, "dead", max_retries=0)
    assert store.requeue_dead_job(requeued.id)  # the API forgot to drop it from the DLQ
    dispatcher.push([("default", 5, str(requeued.id))])
    unknown = str(uuid.uuid4())
    dispatcher.push([("default", 5, unknown), ("default", 2, str(done.id))])
    dispatcher.schedule("default", str(done.id), 1, retry=True)
    backdate(store)

    result = reconciler(store, dispatcher, settings).run_once()

    assert result.corrupted == {"ready": 2, "retry": 1, "dlq": 1}
    assert result.missing == {}
    assert items(dispatcher, DEFAULT.ready(5)) == [str(requeued.id), str(keep.id)]
    assert items(dispatcher, DEFAULT.ready(2)) == []
    assert dispatcher.client.zcard(DEFAULT.retry) == 0
    assert items(dispatcher, DEFAULT.dlq) == []


def test_duplicate_ids_run_once_and_leftovers_are_cleaned(store, dispatcher, settings):
    job = enqueue(store, dispatcher)  # once in ready:5 ...
    dispatcher.push([("default", 5, str(job.id)), ("default", 7, str(job.id))])  # ... 3 copies
    backdate(store)
    assert reconciler(store, dispatcher, settings).run_once().changed is False

    claims = []
    for worker in ("w1", "w2"):
        (fetched,) = dispatcher.fetch("default", worker, 1)
        claims += store.claim_jobs([fetched], worker, 15)
    assert [c.job.id for c in claims] == [job.id]  # w1 won, w2's claim found it running
    assert succeed(store, claims[0].lease_id, "w1", "ok")
    dispatcher.ack([("default", str(job.id))], "w1")

    result = reconciler(store, dispatcher, settings).run_once()

    # w2's copy (a worker that died before dropping its lost claim) and the one still in ready
    assert result.corrupted == {"ready": 1, "processing": 1}
    assert all_ready(dispatcher, DEFAULT) == []
    assert items(dispatcher, DEFAULT.processing("w2")) == []
    assert store.get_job(job.id).attempts == 1


def test_an_id_running_under_another_workers_lease_is_removed_as_a_duplicate(
        store, dispatcher, settings):
    job = enqueue(store, dispatcher)
    dispatcher.push([("default", 5, str(job.id))])
    assert dispatcher.fetch("default", "w1", 1) == [str(job.id)]
    assert dispatcher.fetch("default", "w2", 1) == [str(job.id)]
    assert store.claim_jobs([job.id], "w1", 15)

    result = reconciler(store, dispatcher, settings).run_once()

    assert result.corrupted == {"duplicate": 1}
    assert items(dispatcher, DEFAULT.processing("w1")) == [str(job.id)]
    assert items(dispatcher, DEFAULT.processing("w2")) == []
    assert store.get_job(job.id).status == "running"


def test_a_stranded_id_in_a_live_workers_list_returns_to_ready(store, dispatcher, settings):
    job = enqueue(store, dispatcher, priority=4)
    dispatcher.heartbeat("w1", 30)  # alive, but its LMOVE reply was lost: it never claims
    assert dispatcher.fetch("default", "w1", 1) == [str(job.id)]

    result = reconciler(store, dispatcher, settings).run_once()

    assert result.corrupted == {"stranded": 1}
    assert items(dispatcher, DEFAULT.processing("w1")) == []
    assert items(dispatcher, DEFAULT.ready(4)) == [str(job.id)]
    assert dispatcher.fetch("default", "w2", 1) == [str(job.id)]
    assert [c.job.id for c in store.claim_jobs([job.id], "w2", 15)] == [job.id]


def test_a_worker_that_claims_during_the_pause_keeps_its_job(store, dispatcher, settings):
    job = enqueue(store, dispatcher)
    assert dispatcher.fetch("default", "w1", 1) == [str(job.id)]
    slow = Reconciler(store, dispatcher, settings, strand_pause_s=0.5)
    claimed = []
    timer = threading.Timer(
        0.15, lambda: claimed.extend(store.claim_jobs([job.id], "w1", 15)))
    timer.start()

    result = slow.run_once()
    timer.join()

    assert [c.job.id for c in claimed] == [job.id]
    assert result.corrupted == {}
    assert items(dispatcher, DEFAULT.processing("w1")) == [str(job.id)]
    assert all_ready(dispatcher, DEFAULT) == []


def test_100k_pending_jobs_after_flushdb_are_restored_in_one_pass(store, dispatcher,
                                                                   settings):
    with store.transaction() as conn:
        conn.execute(text(
            "INSERT INTO taskline.jobs (id, type, queue, payload, priority, status, max_retries,"
            " timeout_s, next_run_at, created_at, updated_at)"
            " SELECT gen_random_uuid(), 'echo', 'default', '{}', i % 10, 'queued', 3, 30,"
            " now(), now() - interval '1 minute', now() - interval '1 minute'"
            " FROM generate_series(1, 100000) AS i"))
    dispatcher.client.flushdb()

    started = time.perf_counter()
    result = Reconciler(store, dispatcher, settings).run_once()
    elapsed = time.perf_counter() - started

    print(f"\nreconciled 100,000 pending jobs after FLUSHDB in {elapsed:.2f} s")
    assert result.missing == {"queued": 100_000}
    depths = dispatcher.depths("default")
    assert depths["ready"] == {p: 10_000 for p in range(10)}


def test_a_cancelled_jobs_ready_entry_is_stale_not_drift(store, dispatcher, settings):
    cancelled = enqueue(store, dispatcher)  # pushed, then cancelled while queued
    assert store.cancel_pending_job(cancelled.id) is not None
    gone = succeeded(store, dispatcher)
    dispatcher.push([("default", 5, str(gone.id))])  # a finished job's id: real drift
    backdate(store)
    before = REGISTRY.get_sample_value("reconciliation_stale_ids_total", {"queue": "default"})

    result = reconciler(store, dispatcher, settings).run_once()

    assert result.stale == 1
    assert result.corrupted == {"ready": 1}
    assert all_ready(dispatcher, DEFAULT) == []
    after = REGISTRY.get_sample_value("reconciliation_stale_ids_total", {"queue": "default"})
    assert after == (before or 0) + 1


def test_a_pass_skips_queue_names_empty_in_redis_and_postgresql(store, dispatcher, settings):
    # Names left in Redis's queue registry by queues long drained: 300 of them, all empty.
    dispatcher.client.sadd(QUEUES_SET, *(f"drained-{i:03}" for i in range(300)))
    stale = str(uuid.uuid4())  # an id of no job, left in a ready list of a queue Redis knows
    dispatcher.push([("leftover", 5, stale)])
    snapshotted: list[str] = []
    real = dispatcher.snapshot

    def recording(dest: str, sources: list[str], ttl_s: int) -> int:
        snapshotted.append(dest)
        return real(dest, sources, ttl_s)

    dispatcher.snapshot = recording  # type: ignore[method-assign]
    result = reconciler(store, dispatcher, settings).run_once()
    assert result.corrupted.get("ready") == 1
    assert all_ready(dispatcher, QueueKeys("leftover")) == []
    assert snapshotted and not any("drained-" in key for key in snapshotted)
