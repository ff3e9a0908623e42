"""Leadership against real PostgreSQL: one maintenance instance acts at a time, a failed or
refused renewal stops it at once, a standby takes over after the ttl (or at once after a clean
release), and component loops survive failed passes."""

from __future__ import annotations

import time

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import text

from taskline.dispatch.keys import QueueKeys
from taskline.errors import StoreUnavailable
from taskline.store.store import Store
from taskline_maintenance.leader import Leader
from taskline_maintenance.main import Maintenance
from tests.helpers import enqueue, wait_for

READY = QueueKeys("default").ready(5)


def backdate(store: Store) -> None:
    with store.transaction() as conn:
        conn.execute(text("UPDATE taskline.jobs SET updated_at = updated_at - interval '1 minute'"))


def test_one_holder_and_a_takeover_after_the_ttl(store):
    a = Leader(store, ttl_s=1.0, holder="a")
    b = Leader(store, ttl_s=1.0, holder="b")
    assert a.run_once().held and a.holds()
    assert not b.run_once().held and not b.holds()

    # a stops renewing (frozen, partitioned): it stops trusting its lease by itself ...
    wait_for(lambda: not a.holds(), timeout=3, message="a's local validity to end")
    # ... and b takes over only once PostgreSQL says the ttl has passed.
    wait_for(lambda: b.run_once().held, timeout=5, message="b's takeover")
    assert b.holds() and not a.holds()
    assert a.run_once().held is False  # a's renewal is refused: it stays out


def test_a_failed_renewal_stops_acting_at_once(store):
    leader = Leader(store, ttl_s=30, holder="a")
    assert leader.run_once().held
    unreachable = Store.connect("postgresql://root@127.0.0.1:1/taskline")
    leader.store = unreachable  # PostgreSQL is gone for this instance
    try:
        with pytest.raises(StoreUnavailable):
            leader.run_once()
        assert not leader.holds()
    finally:
        unreachable.dispose()
    assert REGISTRY.get_sample_value("taskline_maintenance_leader") == 0


def test_two_instances_only_one_acts_and_a_clean_stop_hands_over(store, dispatcher, settings):
    a = Maintenance(store, dispatcher, settings, holder="a")
    b = Maintenance(store, dispatcher, settings, holder="b")
    a.start()
    try:
        wait_for(a.leader.holds, message="a to lead")
        b.start()
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:  # b renews at least once in this window
            assert a.leader.holds() and not b.leader.holds()
            time.sleep(0.05)
        a.stop()
        job = enqueue(store, dispatcher, push=False)  # Redis lost it; only b may repair it
        backdate(store)
        wait_for(b.leader.holds, timeout=5, message="b to take over")
        wait_for(lambda: dispatcher.list_range(READY, 0, -1) == [str(job.id)], timeout=5,
                 message="b's reconciler to restore the job")
        assert not a.leader.holds()
    finally:
        a.stop()
        b.stop()
    with store.transaction() as conn:
        assert conn.execute(text("SELECT count(*) FROM taskline.leader_leases")).scalar_one() == 0


def test_a_standby_does_nothing(store, dispatcher, settings):
    other = Leader(store, ttl_s=30, holder="other")
    assert other.run_once().held
    standby = Maintenance(store, dispatcher, settings, holder="standby")
    job = enqueue(store, dispatcher, push=False)
    backdate(store)
    standby.start()
    try:
        time.sleep(1.0)  # proving an absence: longer than the standby's passes and polls
        assert not standby.leader.holds()
        assert dispatcher.list_range(READY, 0, -1) == []
        other.release()
        wait_for(lambda: dispatcher.list_range(READY, 0, -1) == [str(job.id)], timeout=5,
                 message="the new leader to restore the job")
    finally:
        standby.stop()
