"""A Redis outage slows dispatch and stops nothing, against real servers (a private Redis that
is killed, frozen and restarted): the breaker, the worker's postgres mode (claims straight
from PostgreSQL, woken by LISTEN/NOTIFY), the promoter and API going on, the rebuild marker,
and the return to Redis only once Redis is rebuilt."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from taskline import flow, transitions
from taskline.dispatch.dispatcher import Dispatcher
from taskline.dispatch.keys import QueueKeys, dispatch_marker_ms
from taskline.errors import DispatchUnavailable
from taskline.mirror import Mirror
from taskline.readiness import CHANNEL
from taskline.store.store import Store
from taskline.transitions import Committed
from taskline_maintenance.promoter import Promoter
from taskline_maintenance.reaper import Reaper
from taskline_maintenance.rebuilder import Rebuilder
from taskline_maintenance.reconciler import Reconciler
from taskline_producer.app import close_app, create_app
from tests.helpers import enqueue, wait_for
from tests.integration import worker_handlers as th
from tests.integration.worker_handlers import running_worker

pytestmark = pytest.mark.usefixtures("clean_handlers")


@pytest.fixture
def private_store(private_settings) -> Iterator[Store]:
    store = Store.connect(private_settings.database_url, pool_size=4)
    yield store
    store.dispose()


@pytest.fixture
def api(private_settings):
    app = create_app(private_settings)
    yield app.test_client()
    close_app(app)


def status(store: Store, job_id) -> str:
    return store.get_job(job_id).status.value


def post_job(api, **body) -> str:
    response = api.post("/api/v1/jobs", json={"type": "t.record", **body})
    assert response.status_code == 201, response.get_data(as_text=True)
    return response.get_json()["id"]


def rebuild(store: Store, dispatcher: Dispatcher, settings) -> Rebuilder:
    """A rebuilder that has rebuilt Redis once (no settle wait: the test is the only producer)."""
    rebuilder = Rebuilder(store, dispatcher, Reconciler(store, dispatcher, settings), settle_s=0)
    assert rebuilder.run_once().state == "rebuilt"
    return rebuilder


def test_the_breaker_fails_calls_at_once_after_a_failure_until_redis_answers(private_redis):
    dispatcher = Dispatcher(private_redis.url, breaker=True)
    try:
        dispatcher.ping()
        private_redis.kill()
        with pytest.raises(DispatchUnavailable):
            dispatcher.ping()
        assert dispatcher.breaker.open
        with pytest.raises(DispatchUnavailable, match="unavailable"):
            dispatcher.push([("default", 5, "00000000-0000-0000-0000-000000000001")])
        private_redis.start()
        wait_for(lambda: not dispatcher.breaker.open, message="breaker closed by the probe")
        dispatcher.ping()
    finally:
        dispatcher.close()


def test_a_worker_runs_jobs_from_postgresql_while_redis_is_down(private_settings, private_store,
                                                                  private_redis, api):
    with running_worker(private_settings, concurrency=2) as worker:
        first = post_job(api)
        wait_for(lambda: status(private_store, first) == "succeeded", message="normal run")
        private_redis.kill()
        # Jobs accepted while Redis is down: 201, durable, and run from PostgreSQL.
        ids = [post_job(api, payload={"n": n}) for n in range(5)]
        wait_for(lambda: worker.mode.degraded, message="worker in postgres mode")
        for job_id in ids:
            wait_for(lambda j=job_id: status(private_store, j) == "succeeded",
                     message="job run while Redis is down")
        queues = api.get("/api/v1/queues").get_json()
        assert queues["dispatch"]["mode"] == "postgres"
        assert api.get("/readyz").get_json()["status"] == "degraded"


def test_an_idle_worker_in_postgres_mode_wakes_on_a_notification(private_settings,
                                                                  private_store, private_redis,
                                                                  api):
    with running_worker(private_settings, concurrency=1) as worker:
        private_redis.kill()
        first = post_job(api)
        wait_for(lambda: worker.mode.degraded, message="worker in postgres mode")
        wait_for(lambda: status(private_store, first) == "succeeded", message="drained")
        seen = worker.mode.waker.generation
        job_id = post_job(api)
        wait_for(lambda: worker.mode.waker.generation > seen, message="notified")
        wait_for(lambda: status(private_store, job_id) == "succeeded", message="woken run")


def test_the_worker_returns_to_redis_only_once_redis_is_rebuilt(private_settings,
                                                                  private_store,
                                                                  private_redis, api):
    with running_worker(private_settings, concurrency=1) as worker:
        private_redis.kill()
        gated = post_job(api, type="t.block", payload={"gate": "g"})
        wait_for(lambda: worker.mode.degraded, message="worker in postgres mode")
        wait_for(lambda: status(private_store, gated) == "running", message="claimed from PG")
        private_redis.start()  # back empty: no marker, no ready list
        dispatcher = Dispatcher(private_redis.url)
        try:
            wait_for(lambda: worker.dispatcher.breaker is not None
                     and not worker.dispatcher.breaker.open, message="worker sees Redis")
            old = int(private_store.now().timestamp() * 1000) - 60_000
            dispatcher.set_dispatch_marker(f"old:{old}")  # a stale snapshot's marker
            stop = threading.Event()
            stop.wait(1.0)
            assert worker.mode.degraded, "returned to a Redis that was not rebuilt"
            waiting = post_job(api)  # pushed to Redis now, found by the backstop poll
            th.release("g")
            wait_for(lambda: status(private_store, waiting) == "succeeded",
                     message="job of the switch window")
            rebuild(private_store, dispatcher, private_settings)
            wait_for(lambda: not worker.mode.degraded, message="back to Redis")
            after = post_job(api)
            wait_for(lambda: status(private_store, after) == "succeeded", message="Redis run")
            assert status(private_store, gated) == "succeeded"
        finally:
            dispatcher.close()


def test_a_frozen_redis_sends_the_worker_to_postgresql(private_settings, private_store,
                                                       private_redis):
    """A blackhole: connections stay open and nothing answers; socket timeouts notice it."""
    with running_worker(private_settings, concurrency=1) as worker:
        private_redis.freeze()
        try:
            job = enqueue(private_store, worker.dispatcher, "t.record", push=False)
            wait_for(lambda: worker.mode.degraded, timeout=10, message="postgres mode")
            wait_for(lambda: status(private_store, job.id) == "succeeded",
                     message="run from PostgreSQL")
        finally:
            private_redis.thaw()


def test_the_promoter_promotes_and_notifies_while_redis_is_down(private_settings,
                                                                private_store, private_redis):
    dispatcher = Dispatcher(private_redis.url, breaker=True)
    job = enqueue(private_store, dispatcher, push=False)
    with private_store.transaction() as conn:
        conn.exec_driver_sql("UPDATE taskline.jobs SET status = 'retrying', next_run_at = now() "
                             "WHERE id = %(id)s", {"id": job.id})
    private_redis.kill()
    with psycopg.connect(private_settings.database_url, autocommit=True) as listen:
        listen.execute(f"LISTEN {CHANNEL}")
        try:
            result = Promoter(private_store, dispatcher, private_settings).run_once()
        finally:
            dispatcher.close()
        notes = list(listen.notifies(timeout=2, stop_after=1))
    assert result.promoted == 1 and status(private_store, job.id) == "queued"
    assert [n.payload for n in notes] == ["default"]


def test_the_rebuilder_renews_its_marker_and_rebuilds_a_redis_that_lost_it(store, dispatcher,
                                                                           settings):
    job = enqueue(store, dispatcher, push=False)  # queued in PostgreSQL, absent from Redis
    rebuilder = rebuild(store, dispatcher, settings)
    assert dispatcher.list_range(QueueKeys("default").ready(5), 0, -1) == [str(job.id)]
    first = dispatcher.dispatch_marker()
    assert rebuilder.run_once().state == "up"
    assert dispatch_marker_ms(dispatcher.dispatch_marker()) >= dispatch_marker_ms(first)
    dispatcher.client.flushdb()  # restarted empty
    assert rebuilder.run_once().state == "rebuilt"
    assert dispatcher.list_range(QueueKeys("default").ready(5), 0, -1) == [str(job.id)]
    dispatcher.set_dispatch_marker(first)  # restored from an older snapshot
    assert rebuilder.run_once().state == "rebuilt"
    assert dispatcher.dispatch_marker() != first


def test_a_failed_follow_notifies_the_queues_of_jobs_made_queued(settings, store,
                                                                  unused_port) -> None:
    dead = Dispatcher(f"redis://127.0.0.1:{unused_port}/0", breaker=True)
    changes = [Committed(transitions.HAND_BACK, str(uuid.uuid4()), "mail", 5, worker_id="w1"),
               Committed(transitions.CANCEL, str(uuid.uuid4()), "bulk", 5)]
    with psycopg.connect(settings.database_url, autocommit=True) as listen:
        listen.execute(f"LISTEN {CHANNEL}")
        try:
            with pytest.raises(DispatchUnavailable):
                Mirror(dead, store).follow(changes, action="test", strict=True)
        finally:
            dead.close()
        notes = list(listen.notifies(timeout=1, stop_after=2))
    assert [n.payload for n in notes] == ["mail"]  # a cancel makes nothing ready


def test_the_reaper_recovers_and_notifies_while_redis_is_down(settings, store, dispatcher,
                                                              unused_port) -> None:
    job = enqueue(store, dispatcher, push=False)
    (claimed,) = store.claim_jobs([job.id], "gone-worker", 0.05)
    dead = Dispatcher(f"redis://127.0.0.1:{unused_port}/0", breaker=True)
    with psycopg.connect(settings.database_url, autocommit=True) as listen:
        listen.execute(f"LISTEN {CHANNEL}")
        try:
            wait_for(lambda: Reaper(store, dead, settings).run_once().requeued == 1,
                     message="the expired lease recovered")
        finally:
            dead.close()
        notes = list(listen.notifies(timeout=2, stop_after=1))
    assert status(store, claimed.job.id) == "queued"
    assert [n.payload for n in notes] == ["default"]


def test_a_worker_started_while_redis_is_down_runs_the_most_urgent_first(private_settings,
                                                                         private_store,
                                                                         private_redis):
    dispatcher = Dispatcher(private_redis.url)
    try:
        for tag, priority in [("low", 2), ("high-1", 7), ("critical", 9), ("high-2", 7),
                              ("normal", 5)]:
            enqueue(private_store, dispatcher, "t.record", {"tag": tag}, priority=priority,
                    push=False)
    finally:
        dispatcher.close()
    private_redis.kill()
    with running_worker(private_settings, concurrency=1) as worker:
        wait_for(lambda: len(th.tags()) == 5, message="5 jobs run")
        assert worker.mode.degraded
    assert th.tags() == ["critical", "high-1", "high-2", "normal", "low"]


def test_limited_jobs_run_under_their_budget_while_redis_is_down(private_settings,
                                                                 private_store, private_redis):
    private_store.put_flow_limit(flow.Limit("type:t.record", concurrency=1))
    dispatcher = Dispatcher(private_redis.url)
    try:
        jobs = [enqueue(private_store, dispatcher, "t.record", {"tag": str(n)}, push=False)
                for n in range(3)]
    finally:
        dispatcher.close()
    private_redis.kill()
    with running_worker(private_settings, concurrency=2) as worker:
        for job in jobs:
            wait_for(lambda j=job: status(private_store, j.id) == "succeeded", timeout=20,
                     message="limited job run from PostgreSQL")
        assert worker.mode.degraded
