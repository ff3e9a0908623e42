"""`Store.holding` against real PostgreSQL: a thread's statements share one connection inside
the block, never two statements at once, and a connection that failed, outlived its pool or
was left in a transaction is not reused; the pool has it back when the block ends."""

from __future__ import annotations

import threading

import psycopg
import pytest
from psycopg.pq import TransactionStatus
from sqlalchemy import event

from taskline.errors import StoreUnavailable
from taskline.store import held
from taskline.store.store import Store
from tests.helpers import enqueue


def backend(store: Store) -> int:
    """The server process of the connection this thread's next statement runs on."""
    with store._driver() as driver:
        return driver.info.backend_pid


def test_a_threads_statements_share_one_connection_inside_the_block(store: Store):
    with store.holding():
        first = backend(store)
        assert backend(store) == first and backend(store) == first
        assert store.engine.pool.checkedout() == 1  # held between statements
    assert store.engine.pool.checkedout() == 0


def test_a_statement_inside_another_takes_a_connection_of_its_own(store: Store):
    with store.holding():
        with store._driver() as outer:
            assert backend(store) != outer.info.backend_pid
        assert backend(store) == outer.info.backend_pid


def test_each_thread_holds_its_own(store: Store):
    seen: dict[str, int] = {}

    def run(name: str, started: threading.Barrier) -> None:
        with store.holding():
            seen[name] = backend(store)
            started.wait()  # both hold theirs at once

    barrier = threading.Barrier(2)
    threads = [threading.Thread(target=run, args=(n, barrier)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen["a"] != seen["b"]


def test_a_connection_a_statement_failed_on_is_discarded(store: Store):
    with store.holding():
        first = backend(store)
        with pytest.raises(psycopg.errors.UndefinedTable), store._driver() as driver:
            driver.execute("SELECT * FROM no_such_table")
        assert backend(store) != first
        assert store.engine.pool.checkedout() == 1


def test_a_connection_of_a_replaced_pool_is_given_back(store: Store):
    with store.holding():
        first = backend(store)
        store.engine.dispose()  # as after an outdated plan: the held one is the old pool's
        assert backend(store) != first
        with psycopg.connect(store.engine.url.set(drivername="postgresql")
                             .render_as_string(hide_password=False)) as conn:
            alive = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                                 (first,)).fetchone()[0]
        assert alive == 0  # closed with its pool


def test_a_connection_left_in_a_transaction_is_given_back_and_rolled_back(store: Store):
    checkins: list[object] = []
    event.listen(store.engine.pool, "checkin", lambda *_: checkins.append(1))
    with store.holding():
        with store._driver() as driver:
            driver.execute("CREATE TEMP TABLE left_open (n int)")  # autocommit off: open
            assert driver.info.transaction_status == TransactionStatus.INTRANS
        with store._driver() as driver:
            assert driver.info.transaction_status == TransactionStatus.IDLE
            assert driver.execute("SELECT to_regclass('pg_temp.left_open')").fetchone() == (
                None,)  # the pool's reset rolled the transaction back
        assert len(checkins) == 1


def test_a_held_connection_is_given_back_after_hold_s(store: Store, monkeypatch):
    checkins: list[object] = []
    event.listen(store.engine.pool, "checkin", lambda *_: checkins.append(1))
    with store.holding():
        for _ in range(3):
            backend(store)
        assert checkins == []  # kept between statements
        monkeypatch.setattr(held, "HOLD_S", 0.0)
        for _ in range(3):
            backend(store)
        assert len(checkins) == 3  # each one older than HOLD_S: given back, another taken
    assert len(checkins) == 4


def test_claims_and_settles_run_on_the_held_connection(store: Store, dispatcher):
    jobs = [enqueue(store, dispatcher, push=False) for _ in range(3)]
    with store.holding():
        first = backend(store)
        claimed = store.claim_jobs([j.id for j in jobs], "w1", 15.0)
        settled = store.settle_succeeded([(c.lease_id, None) for c in claimed], "w1")
        assert backend(store) == first
    assert sorted(r.id for r in settled) == sorted(j.id for j in jobs)
    assert {store.get_job(j.id).status for j in jobs} == {"succeeded"}


def test_an_unreachable_database_still_surfaces_as_store_unavailable(unused_port):
    store = Store.connect(f"postgresql://root@127.0.0.1:{unused_port}/none", pool_size=1)
    try:
        with store.holding(), pytest.raises(StoreUnavailable):
            store.claim_jobs(["00000000-0000-0000-0000-000000000000"], "w1", 15.0)
    finally:
        store.dispose()
