"""The store's state changes against real PostgreSQL: one winner per claim, fencing on every
write, recovery in PostgreSQL time, promotion, cancel, requeue and leadership, connections
opened ahead, and prepared statements (on their first run; outdated by a migration)."""

from __future__ import annotations

import threading
import time
import uuid

import psycopg
import pytest
from sqlalchemy import text

from taskline import transitions
from taskline.errors import StoreUnavailable
from taskline.store.rows import Settlement
from taskline.store.store import Store
from tests.helpers import enqueue, fail, succeed, wait_for


def claim_one(store: Store, dispatcher, worker="w1", lease_s=15.0, **kw):
    job = enqueue(store, dispatcher, push=False, **kw)
    (claimed,) = store.claim_jobs([job.id], worker, lease_s)
    return claimed


def test_claim_has_exactly_one_winner_among_racing_workers(store: Store, dispatcher):
    jobs = [enqueue(store, dispatcher, push=False) for _ in range(30)]
    ids = [j.id for j in jobs]
    wins: dict[str, list] = {}
    barrier = threading.Barrier(6)

    def race(worker: str) -> None:
        barrier.wait()
        wins[worker] = [c.job.id for c in store.claim_jobs(ids, worker, 15)]

    threads = [threading.Thread(target=race, args=(f"w{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    all_wins = [i for won in wins.values() for i in won]
    assert sorted(all_wins) == sorted(ids)
    with store.transaction() as conn:
        leases = conn.execute(text("SELECT count(*) FROM taskline.job_leases")).scalar_one()
        attempts = conn.execute(text("SELECT sum(attempts) FROM taskline.jobs")).scalar_one()
    assert leases == 30 and attempts == 30


def test_completion_is_fenced_by_the_lease(store: Store, dispatcher):
    claimed = claim_one(store, dispatcher)
    assert succeed(store, claimed.lease_id, "intruder", {"n": 1}) == []
    assert [(r.id, r.queue, r.status) for r in succeed(store, claimed.lease_id, "w1",
                                                        {"n": 1})] == [
        (claimed.job.id, "default", "succeeded")]
    assert succeed(store, claimed.lease_id, "w1", {"n": 2}) == []
    job = store.get_job(claimed.job.id)
    assert job.status == "succeeded" and job.result == {"n": 1}


def test_a_zombie_cannot_record_after_its_lease_was_recovered(store: Store, dispatcher):
    claimed = claim_one(store, dispatcher, lease_s=0.05)
    time.sleep(0.1)
    recovered = store.recover_expired(100)
    assert [(r.expired.id, r.settled.status, r.expired.worker_id) for r in recovered] == [
        (claimed.job.id, "queued", "w1")]
    (second,) = store.claim_jobs([claimed.job.id], "w2", 15)
    assert second.job.attempts == 2
    assert fail(store, claimed.lease_id, "w1", "late") is None
    assert succeed(store, claimed.lease_id, "w1", "late") == []
    assert store.renew_leases([claimed.lease_id], "w1", 15) == {}
    assert store.settle([Settlement(claimed.lease_id, "w1", transitions.handed_back())]) == []
    assert succeed(store, second.lease_id, "w2", "ok")
    events, leases = store.get_history(claimed.job.id)
    assert [e["event"] for e in events] == [
        "enqueued", "claimed", "recovered", "claimed", "succeeded"]
    assert [lease["outcome"] for lease in leases] == ["lost", "succeeded"]


def test_recovery_of_the_last_attempt_dead_letters(store: Store, dispatcher):
    claimed = claim_one(store, dispatcher, lease_s=0.05, max_retries=0)
    time.sleep(0.1)
    (row,) = store.recover_expired(100)
    assert row.dead and row.transition.move is transitions.RECOVER_DEAD
    (dead,) = store.list_dead(queue=None, after=None, limit=10)
    assert dead["job"].id == claimed.job.id and dead["attempts"] == 1
    assert "lease expired" in dead["final_error"]


def test_live_leases_are_renewed_not_recovered(store: Store, dispatcher):
    claimed = claim_one(store, dispatcher, lease_s=0.3)
    for _ in range(4):
        assert store.renew_leases([claimed.lease_id], "w1", 0.3) == {claimed.lease_id: False}
        assert store.recover_expired(100) == []
        time.sleep(0.1)


@pytest.mark.timeout(60)
def test_renewal_skips_a_lease_whose_outcome_is_being_written(store: Store, dispatcher):
    """A transaction holding one lease's row (an outcome with slow on_complete hooks) must not
    hold back the renewal of the others: that lease is reported busy, the others renewed. A
    renewal that waited would wait here for ever (this thread holds the lock), and time out."""
    writing, other = claim_one(store, dispatcher), claim_one(store, dispatcher)
    with store.transaction() as conn:  # the outcome's transaction, its commit still to come
        conn.execute(text("UPDATE taskline.job_leases SET outcome = 'succeeded' WHERE id = :id"),
                     {"id": writing.lease_id})
        kept = store.renew_leases([writing.lease_id, other.lease_id], "w1", 15)
        assert kept == {writing.lease_id: None, other.lease_id: False}
        conn.rollback()  # the outcome failed: the lease is live and renewed again next pass
    assert store.renew_leases([writing.lease_id], "w1", 15) == {writing.lease_id: False}


def test_renewal_reports_a_cancel_request(store: Store, dispatcher):
    claimed = claim_one(store, dispatcher)
    assert store.cancel_running_job(claimed.job.id).cancel_requested
    assert store.renew_leases([claimed.lease_id], "w1", 15) == {claimed.lease_id: True}
    assert store.settle([Settlement(claimed.lease_id, "w1", transitions.cancelled_while_running(
        "cancelled by request"))])
    assert store.get_job(claimed.job.id).status == "cancelled"


def test_failure_schedules_a_retry_in_postgresql_time(store: Store, dispatcher):
    claimed = claim_one(store, dispatcher)
    before = store.now()
    row = fail(store, claimed.lease_id, "w1", delay_s=0.2)
    assert abs(row.due_ms - (before.timestamp() + 0.2) * 1000) < 1000
    assert store.promote_due(10) == []
    promoted = wait_for(lambda: store.promote_due(10), timeout=3)
    assert [p.id for p in promoted] == [claimed.job.id]
    assert store.get_job(claimed.job.id).status == "queued"


def test_release_hands_back_without_counting_the_attempt(store: Store, dispatcher):
    claimed = claim_one(store, dispatcher)
    released = store.settle([Settlement(claimed.lease_id, "w1", transitions.handed_back())])
    assert [r.id for r in released] == [claimed.job.id]
    job = store.get_job(claimed.job.id)
    assert job.status == "queued" and job.attempts == 0
    (again,) = store.claim_jobs([job.id], "w2", 15)
    assert again.job.attempts == 1


def test_cancel_pending_and_requeue_dead(store: Store, dispatcher):
    pending = enqueue(store, dispatcher, push=False)
    assert store.cancel_pending_job(pending.id).status == "cancelled"
    assert store.cancel_pending_job(pending.id) is None
    claimed = claim_one(store, dispatcher)
    fail(store, claimed.lease_id, "w1", "fatal")
    requeued = store.requeue_dead_job(claimed.job.id)
    assert requeued.status == "queued" and requeued.attempts == 0
    assert store.requeue_dead_job(claimed.job.id) is None
    assert store.list_dead(queue=None, after=None, limit=10) == []


def test_idempotency_key_keeps_one_row(store: Store):
    fields = dict(type="echo", queue="default", payload={}, priority=5, status="queued",
                  max_retries=0, timeout_s=5, idempotency_key="k1", request_hash="h")
    with store.transaction() as conn:
        first = store.insert_job(conn, id=uuid.uuid4(), **fields)
        second = store.insert_job(conn, id=uuid.uuid4(), **fields)
    assert first is not None and second is None
    assert store.get_job_by_key("default", "k1").id == first.id


def test_only_one_leader_at_a_time(store: Store):
    assert store.acquire_leader("m", "a", 0.3)
    assert not store.acquire_leader("m", "b", 0.3)
    assert store.acquire_leader("m", "a", 0.3)
    wait_for(lambda: store.acquire_leader("m", "b", 5), timeout=3)
    assert not store.acquire_leader("m", "a", 5)
    store.release_leader("m", "b")
    assert store.acquire_leader("m", "a", 5)


def test_connections_opened_ahead_wait_idle_in_the_pool(settings):
    store = Store.connect(settings.database_url, pool_size=4)
    try:
        store.open_connections(3)
        assert store.engine.pool.checkedin() == 3 and store.engine.pool.checkedout() == 0
        store.open_connections(6)  # beyond the pool's size: only its size stays open
        assert store.engine.pool.checkedin() == 4
    finally:
        store.dispose()


def test_connections_cannot_be_opened_ahead_while_postgresql_is_down(unused_port):
    store = Store.connect(f"postgresql://root@127.0.0.1:{unused_port}/postgres", pool_size=2)
    try:
        with pytest.raises(StoreUnavailable):
            store.open_connections(2)
        assert store.engine.pool.checkedout() == 0
    finally:
        store.dispose()


def test_hot_statements_are_prepared_on_their_first_run(settings, dispatcher):
    store = Store.connect(settings.database_url, pool_size=1, max_overflow=0)
    try:
        claimed = claim_one(store, dispatcher)
        succeed(store, claimed.lease_id, "w1")
        with store.engine.connect() as conn:
            prepared = conn.execute(text(
                "SELECT statement FROM pg_prepared_statements WHERE NOT from_sql")).scalars().all()
        assert any("INSERT INTO taskline.job_leases" in s for s in prepared), "the claim, once run"
        assert any("UPDATE taskline.live_leases" in s for s in prepared), "the settle, once run"
    finally:
        store.dispose()


def test_a_column_added_under_prepared_statements_costs_one_retry(settings, dispatcher):
    """A migration adding a column to `jobs` (as a rolling deploy runs beside older processes)
    outdates every prepared `RETURNING *`: the next statement is refused before it runs, as an
    outage the callers retry, and the whole pool is replaced, so each path fails once at most."""
    def migrate(column: str) -> None:  # from another process's connection, as a deploy does
        with psycopg.connect(settings.database_url, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE taskline.jobs ADD COLUMN {column} integer")

    store = Store.connect(settings.database_url, pool_size=2, max_overflow=0)
    try:
        job = enqueue(store, dispatcher, push=False)
        for _ in range(6):  # psycopg prepares this one after its fifth run
            store.get_job(job.id)
        migrate("added_by_a_migration")
        with pytest.raises(StoreUnavailable):
            store.get_job(job.id)
        assert store.get_job(job.id).id == job.id, "a new connection plans it anew"
        store.claim_jobs([enqueue(store, dispatcher, push=False).id], "w1", 15.0)
        waiting = enqueue(store, dispatcher, push=False)
        migrate("added_by_another")
        with pytest.raises(StoreUnavailable):
            store.claim_jobs([waiting.id], "w1", 15.0)
        (claimed,) = store.claim_jobs([waiting.id], "w1", 15.0)
        assert claimed.job.attempts == 1, "the refused claim did not run"
    finally:
        store.dispose()


def _claim_plans(store: Store) -> tuple[str, int, int]:
    """The store's plan_cache_mode, and the (generic, custom) plans its claim's prepared
    statement ran. Read in autocommit: psycopg deallocates every prepared statement of a
    connection whose transaction rolls back, as the pool's return does with one left open."""
    with store.engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        mode = conn.execute(text("SHOW plan_cache_mode")).scalar()
        (generic, custom), = [(g, c) for s, g, c in conn.execute(text(
            "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"))
            if "INSERT INTO taskline.job_leases" in s]
    return mode, generic, custom


def test_a_generic_plans_store_plans_its_claim_once(settings, dispatcher):
    """generic_plans (the worker's store): the claim runs the plan made when it was prepared,
    never one per call, whatever PostgreSQL's estimates favour (docs/performance.md)."""
    store = Store.connect(settings.database_url, pool_size=1, max_overflow=0,
                          generic_plans=True)
    try:
        for _ in range(8):
            succeed(store, claim_one(store, dispatcher).lease_id, "w1")
        assert _claim_plans(store) == ("force_generic_plan", 8, 0)
    finally:
        store.dispose()


def test_by_default_postgresql_plans_the_claim_per_call_first(settings, dispatcher):
    """The control: left to choose, PostgreSQL plans a prepared statement for each call's
    values at least five times, and after that whenever its estimates favour it."""
    store = Store.connect(settings.database_url, pool_size=1, max_overflow=0)
    try:
        for _ in range(8):
            succeed(store, claim_one(store, dispatcher).lease_id, "w1")
        mode, generic, custom = _claim_plans(store)
        assert mode == "auto" and custom >= 5 and generic + custom == 8
    finally:
        store.dispose()


def test_a_transaction_pooled_store_sets_no_plan_mode(settings):
    """Through a transaction pooler nothing is prepared, and a session setting would pass to
    the pooler's other clients: generic_plans sets nothing there."""
    store = Store.connect(settings.database_url, pool_size=1, max_overflow=0,
                          generic_plans=True, transaction_pooled=True)
    try:
        with store.engine.connect() as conn:
            assert conn.execute(text("SHOW plan_cache_mode")).scalar() == "auto"
    finally:
        store.dispose()
