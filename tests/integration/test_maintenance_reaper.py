"""The reaper against real PostgreSQL and Redis: expired leases are recovered (requeued or
dead-lettered) in PostgreSQL time, live leases and missing heartbeat keys are left alone, and
silent workers' registry rows are closed; between passes the reaper wakes at the next lease
expiry rather than a whole interval later."""

from __future__ import annotations

import threading

from prometheus_client import REGISTRY
from sqlalchemy import text

from taskline.dispatch.dispatcher import Dispatcher
from taskline.dispatch.keys import QueueKeys, worker_key
from taskline.store.store import Claimed, Store
from taskline_maintenance.reaper import Reaper
from tests.helpers import enqueue, wait_for

KEYS = QueueKeys("default")


def running(store: Store, dispatcher: Dispatcher, worker: str = "w1", lease_s: float = 0.2,
            **kw) -> Claimed:
    """A job fetched into `worker`'s processing list and claimed under a lease of `lease_s`."""
    job = enqueue(store, dispatcher, **kw)
    assert dispatcher.fetch("default", worker, 1) == [str(job.id)]
    (claimed,) = store.claim_jobs([job.id], worker, lease_s)
    return claimed


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_an_expired_lease_is_recovered_to_ready(store, dispatcher, settings):
    claimed = running(store, dispatcher, priority=7)
    job_id = str(claimed.job.id)
    reaper = Reaper(store, dispatcher, settings)
    before = sample("job_recovered_total", queue="default", cause="lease_expired")

    wait_for(lambda: reaper.run_once().requeued, message="recovery")

    job = store.get_job(claimed.job.id)
    assert job.status == "queued" and job.attempts == 1
    events, leases = store.get_history(claimed.job.id)
    assert [lease["outcome"] for lease in leases] == ["lost"]
    assert events[-1]["event"] == "recovered" and events[-1]["worker_id"] == "w1"
    assert dispatcher.list_range(KEYS.ready(7), 0, -1) == [job_id]
    assert dispatcher.list_range(KEYS.processing("w1"), 0, -1) == []
    assert sample("job_recovered_total", queue="default", cause="lease_expired") == before + 1
    assert reaper.run_once().changed is False


def test_an_expired_last_attempt_is_dead_lettered(store, dispatcher, settings):
    claimed = running(store, dispatcher, max_retries=0)
    reaper = Reaper(store, dispatcher, settings)

    wait_for(lambda: reaper.run_once().dead_lettered, message="dead-lettering")

    assert store.get_job(claimed.job.id).status == "dead"
    with store.transaction() as conn:
        row = conn.execute(text("SELECT attempts, final_error FROM taskline.dead_letter_jobs "
                                "WHERE job_id = :id"), {"id": claimed.job.id}).one()
    assert row.attempts == 1 and "lease expired" in row.final_error
    assert dispatcher.list_range(KEYS.dlq, 0, -1) == [str(claimed.job.id)]
    assert dispatcher.list_range(KEYS.processing("w1"), 0, -1) == []
    assert all(dispatcher.list_range(k, 0, -1) == [] for k in KEYS.ready_by_urgency)


def test_a_renewed_lease_is_not_reaped(store, dispatcher, settings):
    claimed = running(store, dispatcher, lease_s=0.3)
    assert store.renew_leases([claimed.lease_id], "w1", 30)
    wait_for(lambda: store.now() > claimed.leased_until, message="first lease end")

    result = Reaper(store, dispatcher, settings).run_once()

    assert result.requeued == 0 and result.dead_lettered == 0
    assert store.get_job(claimed.job.id).status == "running"
    assert dispatcher.list_range(KEYS.processing("w1"), 0, -1) == [str(claimed.job.id)]


def test_a_missing_heartbeat_key_alone_recovers_nothing(store, dispatcher, settings):
    claimed = running(store, dispatcher, lease_s=30)
    dispatcher.heartbeat("w1", 30)
    dispatcher.client.flushdb()  # what a Redis restart does to every live worker's key
    assert dispatcher.client.exists(worker_key("w1")) == 0

    result = Reaper(store, dispatcher, settings).run_once()

    assert result.requeued == 0 and result.dead_lettered == 0
    job = store.get_job(claimed.job.id)
    assert job.status == "running" and job.attempts == 1
    _, leases = store.get_history(claimed.job.id)
    assert leases[0]["released_at"] is None


def test_recovery_pages_until_every_expired_lease_is_done(store, dispatcher, settings):
    jobs = [running(store, dispatcher, lease_s=0.1) for _ in range(5)]
    wait_for(lambda: store.now() > max(c.leased_until for c in jobs), message="lease ends")

    result = Reaper(store, dispatcher, settings, page_size=2).run_once()

    assert result.requeued == 5
    assert {store.get_job(c.job.id).status for c in jobs} == {"queued"}
    assert sorted(dispatcher.list_range(KEYS.ready(5), 0, -1)) == sorted(
        str(c.job.id) for c in jobs)


def test_silent_workers_registry_rows_are_closed(store, dispatcher, settings):
    store.upsert_worker("gone", "host", 1, ["default"], 1)
    store.upsert_worker("alive", "host", 2, ["default"], 1)
    with store.transaction() as conn:
        conn.execute(text("UPDATE taskline.workers SET last_heartbeat = now() - interval '1 hour' "
                          "WHERE id = 'gone'"))

    result = Reaper(store, dispatcher, settings).run_once()

    assert result.workers_stopped == 1
    assert [w["id"] for w in store.list_workers(3600 * 24)] == ["alive"]


def test_the_reaper_wakes_at_the_next_lease_expiry_not_a_whole_interval_later(
        store, dispatcher, settings):
    """With an interval far longer than the lease, the job is still recovered at its expiry."""
    slow = settings.replace(reaper_interval_s=60.0)
    reaper = Reaper(store, dispatcher, slow)
    stop = threading.Event()
    claimed = running(store, dispatcher, lease_s=1.0)
    assert 0 < reaper.next_wait() <= 1.1
    thread = threading.Thread(target=reaper.run, args=(stop,), daemon=True)
    thread.start()
    try:
        # A fraction of the 60 s interval: only the early wake-up can recover it in time.
        wait_for(lambda: store.get_job(claimed.job.id).status == "queued", timeout=15,
                 message="recovery at lease expiry")
    finally:
        stop.set()
        thread.join(timeout=10)
    assert [lease["outcome"] for lease in store.get_history(claimed.job.id)[1]] == ["lost"]


def test_without_open_leases_the_reaper_waits_its_interval(store, dispatcher, settings):
    reaper = Reaper(store, dispatcher, settings.replace(reaper_interval_s=7.0))
    assert reaper.next_wait() == 7.0
    running(store, dispatcher, lease_s=30)
    assert reaper.next_wait() == 7.0
