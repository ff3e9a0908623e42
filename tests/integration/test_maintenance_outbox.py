"""The outbox relay against real PostgreSQL and Redis: jobs enqueued inside an application's
transaction reach Redis on their commit's signal, and none waits for reconciliation when the
listener was down, lost its connection, changed instance, or when the transaction stayed open
for minutes. The backstop is set to an hour here, so only the signal (or the drain that follows
every LISTEN) can have pushed what these tests see.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
import pytest
from prometheus_client import REGISTRY
from sqlalchemy import Engine, create_engine, text

import taskline
from taskline.dispatch.dispatcher import Dispatcher
from taskline.dispatch.keys import QueueKeys
from taskline.errors import DispatchUnavailable
from taskline.settings import Settings
from taskline.store.store import Store, sqlalchemy_url
from taskline_maintenance.main import Maintenance
from taskline_maintenance.outbox import OutboxRelay
from tests.helpers import service, service_env, wait_for

KEYS = QueueKeys("default")
HOUR = 3600.0


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    eng = create_engine(sqlalchemy_url(database_url))
    yield eng
    eng.dispose()


@contextmanager
def running(relay: OutboxRelay, active: Callable[[], bool] = lambda: True) -> Iterator[None]:
    stop = threading.Event()
    thread = threading.Thread(target=relay.run, args=(stop, active), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)
        assert not thread.is_alive()


def relay_for(store: Store, dispatcher: Dispatcher, settings: Settings) -> OutboxRelay:
    return OutboxRelay(store, dispatcher, settings.database_url, backstop_s=HOUR)


def ready(dispatcher: Dispatcher, priority: int = 5) -> list[str]:
    return dispatcher.list_range(KEYS.ready(priority), 0, -1)


def outbox(store: Store) -> int:
    with store.transaction() as conn:
        return conn.execute(text("SELECT count(*) FROM taskline.enqueue_outbox")).scalar_one()


def relayed() -> float:
    return REGISTRY.get_sample_value("taskline_outbox_relayed_total", {"queue": "default"}) or 0.0


def enqueue_committed(engine: Engine, **fields) -> str:
    with engine.begin() as conn:
        return str(taskline.enqueue(conn, "echo", **fields))


def test_a_commit_signals_the_relay(engine: Engine, store: Store, dispatcher: Dispatcher,
                                    settings: Settings) -> None:
    relay = relay_for(store, dispatcher, settings)
    with running(relay):
        wait_for(lambda: relay.listens == 1, message="the relay to listen")
        with engine.connect() as conn:
            job_id = str(taskline.enqueue(conn, "echo"))
            assert ready(dispatcher) == []  # uncommitted: Redis knows nothing
            conn.commit()
        wait_for(lambda: ready(dispatcher) == [job_id], message="the job to be pushed")
        wait_for(lambda: outbox(store) == 0, message="the outbox row to go")
        assert relay.listens == 1


class CountingRelay(OutboxRelay):
    """The relay with a record of its deletes: how many rows each statement was given."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.deletes: list[int] = []

    def _forget(self, ids: list[uuid.UUID]) -> None:
        if ids:
            self.deletes.append(len(ids))
        super()._forget(ids)


def counting_relay(store: Store, dispatcher: Dispatcher, settings: Settings,
                   forget_after_s: float) -> CountingRelay:
    return CountingRelay(store, dispatcher, settings.database_url, backstop_s=HOUR,
                         forget_after_s=forget_after_s)


def test_a_stream_of_enqueues_is_forgotten_in_few_deletes(
        engine: Engine, store: Store, dispatcher: Dispatcher, settings: Settings) -> None:
    """Every job is pushed on its own signal; the rows of the ids pushed within the interval
    are deleted together."""
    relay = counting_relay(store, dispatcher, settings, forget_after_s=2.0)
    with running(relay):
        wait_for(lambda: relay.listens == 1, message="the relay to listen")
        ids = [enqueue_committed(engine) for _ in range(30)]
        wait_for(lambda: sorted(ready(dispatcher)) == sorted(ids), message="every job pushed")
        wait_for(lambda: outbox(store) == 0, message="the rows to go")
    assert sum(relay.deletes) == 30
    # 30 commits take well under the 2 s interval: one statement, a few if the machine stalls.
    assert len(relay.deletes) <= 10


def test_a_drain_does_not_push_again_what_awaits_its_delete(
        engine: Engine, store: Store, dispatcher: Dispatcher, settings: Settings) -> None:
    relay = counting_relay(store, dispatcher, settings, forget_after_s=HOUR)
    with running(relay):
        wait_for(lambda: relay.listens == 1, message="the relay to listen")
        ids = [enqueue_committed(engine) for _ in range(3)]
        wait_for(lambda: sorted(ready(dispatcher)) == sorted(ids), message="every job pushed")
        assert outbox(store) == 3  # pushed; their rows wait for the interval
        with engine.begin() as conn:  # a queue signal with no announcement: a drain
            conn.execute(text("NOTIFY taskline_enqueued, 'default'"))
        wait_for(lambda: outbox(store) == 0, message="the drain to delete the pushed rows")
        assert sorted(ready(dispatcher)) == sorted(ids)  # each id once
        held = enqueue_committed(engine)
        wait_for(lambda: held in ready(dispatcher), message="the next job pushed")
        assert outbox(store) == 1
    assert outbox(store) == 0  # stopping deletes what was pushed
    assert relay.deletes == [3, 1]


def test_jobs_committed_while_nobody_listened_are_pushed_at_start(
        engine: Engine, store: Store, dispatcher: Dispatcher, settings: Settings) -> None:
    ids = [enqueue_committed(engine) for _ in range(3)]
    delayed = enqueue_committed(engine, delay_s=600, priority=2)
    relay = relay_for(store, dispatcher, settings)
    with running(relay):
        wait_for(lambda: sorted(ready(dispatcher)) == sorted(ids), message="the backlog")
    assert dispatcher.client.zrange(KEYS.scheduled, 0, -1) == [delayed]
    assert outbox(store) == 0


def test_a_lost_listener_connection_drains_again_after_relisten(
        engine: Engine, store: Store, dispatcher: Dispatcher, settings: Settings) -> None:
    relay = relay_for(store, dispatcher, settings)
    with running(relay), psycopg.connect(settings.database_url, autocommit=True) as admin:
        wait_for(lambda: relay.listens == 1, message="the relay to listen")
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                      "WHERE application_name = 'taskline-outbox' AND datname = current_database()")
        # Committed while the relay's connection is gone: its signal reaches nobody.
        job_id = enqueue_committed(engine)
        wait_for(lambda: relay.listens == 2, message="the relay to listen again")
        wait_for(lambda: ready(dispatcher) == [job_id], message="the job to be pushed")
    assert relay.passes.failures >= 1


def test_after_a_failover_the_new_instance_drains(
        engine: Engine, store: Store, dispatcher: Dispatcher, settings: Settings) -> None:
    leader = {"name": "a"}
    first, second = relay_for(store, dispatcher, settings), relay_for(store, dispatcher, settings)
    with running(first, lambda: leader["name"] == "a"), \
            running(second, lambda: leader["name"] == "b"):
        wait_for(lambda: first.listens == 1, message="the first instance to listen")
        assert second.listens == 0
        before = enqueue_committed(engine)
        wait_for(lambda: ready(dispatcher) == [before], message="the first job")
        leader["name"] = None  # the lease lapsed: nobody leads for a while
        wait_for(lambda: first._listener is None, message="the first instance to stop")
        during = enqueue_committed(engine)
        assert ready(dispatcher) == [before]
        leader["name"] = "b"
        wait_for(lambda: sorted(ready(dispatcher)) == sorted([before, during]),
                 message="the job of the gap")
        assert second.listens == 1


def test_a_transaction_open_for_minutes_is_relayed_at_its_commit(
        engine: Engine, store: Store, dispatcher: Dispatcher, settings: Settings) -> None:
    relay = relay_for(store, dispatcher, settings)
    with running(relay):
        wait_for(lambda: relay.listens == 1, message="the relay to listen")
        with engine.connect() as slow:
            old = str(taskline.enqueue(slow, "echo", priority=1))
            # As if this transaction had begun ten minutes ago (a created_at watermark taken
            # since would pass over this job).
            slow.execute(text(
                "UPDATE taskline.jobs SET created_at = now() - interval '10 minutes'"))
            slow.execute(text("UPDATE taskline.enqueue_outbox SET created_at = created_at "
                              "- interval '10 minutes'"))
            later = enqueue_committed(engine)
            wait_for(lambda: ready(dispatcher) == [later], message="the later job")
            # The open transaction's row is not visible yet; the later one's goes after its push.
            wait_for(lambda: outbox(store) == 0, message="the later job's row to go")
            slow.commit()
        wait_for(lambda: ready(dispatcher, 1) == [old], message="the old transaction's job")


def test_a_queue_signal_without_announcement_drains_the_outbox(
        engine: Engine, store: Store, dispatcher: Dispatcher, settings: Settings) -> None:
    """A writer that only signals its queue (and a malformed announcement) still gets its
    rows relayed: the relay reads the outbox for them."""
    relay = relay_for(store, dispatcher, settings)
    with engine.begin() as conn:  # a job and its row as a writer that does not announce
        job_id = taskline.enqueue(conn, "echo")
        conn.execute(text("DELETE FROM taskline.enqueue_outbox"))
        conn.execute(text("INSERT INTO taskline.enqueue_outbox (job_id, queue) VALUES (:id, "
                          "'default')"),
                     {"id": job_id})
    with running(relay):
        wait_for(lambda: ready(dispatcher) == [str(job_id)] and outbox(store) == 0,
                 message="the start drain")
        dispatcher.client.delete(KEYS.ready(5))
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO taskline.enqueue_outbox (job_id, queue) VALUES "
                              "(:id, 'default')"),
                         {"id": job_id})
            conn.execute(text("NOTIFY taskline_enqueued_jobs, 'not an announcement'"))
            conn.execute(text("NOTIFY taskline_enqueued, 'default'"))
        wait_for(lambda: ready(dispatcher) == [str(job_id)], message="the signalled drain")
        wait_for(lambda: outbox(store) == 0, message="the row to go")


def test_ids_stay_owed_while_redis_is_unreachable(
        engine: Engine, store: Store, dispatcher: Dispatcher, settings: Settings,
        unused_port: int) -> None:
    job_id = enqueue_committed(engine)
    down = Dispatcher(f"redis://127.0.0.1:{unused_port}/0", block_timeout_s=0.2)
    try:
        with pytest.raises(DispatchUnavailable):
            OutboxRelay(store, down, settings.database_url).run_once()
    finally:
        down.close()
    assert outbox(store) == 1  # pushed before deleted: nothing was pushed, nothing forgotten
    before = relayed()
    result = relay_for(store, dispatcher, settings).run_once()
    assert (result.pushed, result.forgotten) == (1, 0)
    assert relayed() - before == 1
    assert ready(dispatcher) == [job_id] and outbox(store) == 0


def test_a_job_that_no_longer_waits_is_forgotten_unpushed(
        engine: Engine, store: Store, dispatcher: Dispatcher, settings: Settings) -> None:
    job_id = enqueue_committed(engine)
    assert store.cancel_pending_job(uuid.UUID(job_id)) is not None
    result = relay_for(store, dispatcher, settings).run_once()
    assert (result.pushed, result.forgotten) == (0, 1)
    assert ready(dispatcher) == [] and outbox(store) == 0


def test_maintenance_runs_the_relay_only_while_it_leads(
        engine: Engine, store: Store, dispatcher: Dispatcher, settings: Settings) -> None:
    service = Maintenance(store, dispatcher, settings, holder="outbox-test")
    service.start()
    try:
        wait_for(service.leader.holds, message="leadership")
        job_id = enqueue_committed(engine)
        wait_for(lambda: job_id in ready(dispatcher), message="the job to be relayed")
    finally:
        service.stop()
    assert service.outbox._listener is None


@pytest.mark.slow
def test_workers_run_jobs_committed_in_application_transactions(
        engine: Engine, store: Store, settings: Settings, tmp_path) -> None:
    """`taskline maintenance` and `taskline worker` as processes: a job committed inside an
    application transaction runs, and a rolled-back one never does. Reconciliation is set an
    hour apart, so only the relay can have made the committed job dispatchable."""
    env = service_env(settings, TASKLINE_RECONCILE_INTERVAL_S="3600")
    with service(["maintenance"], env, tmp_path), service(["worker"], env, tmp_path):
        wait_for(lambda: store.list_workers(60), timeout=30, message="the worker to register")
        with engine.connect() as conn:
            rolled_back = taskline.enqueue(conn, "echo", {"n": 0})
            conn.rollback()
        with engine.begin() as conn:
            conn.execute(text("SELECT 1"))  # the application's own work would go here
            job_id = taskline.enqueue(conn, "echo", {"n": 1})
        done = wait_for(lambda: store.get_job(job_id).status == "succeeded", timeout=20,
                        message="the job to run")
        assert done
    assert store.get_job(job_id).result == {"n": 1}
    assert store.get_job(rolled_back) is None


def test_the_depth_gauges_show_the_relays_backlog(engine: Engine, store: Store,
                                                  dispatcher: Dispatcher, settings: Settings):
    from taskline_maintenance.depths import DepthGauges

    def gauges() -> tuple[float | None, float | None]:
        return (REGISTRY.get_sample_value("taskline_outbox_pending_jobs"),
                REGISTRY.get_sample_value("taskline_outbox_oldest_age_seconds"))

    depths = DepthGauges(store, dispatcher, settings)
    depths.run_once()
    assert gauges() == (0.0, 0.0)
    for _ in range(2):  # committed, with no relay running
        enqueue_committed(engine)
    with engine.begin() as conn:
        conn.execute(text("UPDATE taskline.enqueue_outbox SET created_at = now() - interval "
                          "'90 seconds'"))
    depths.run_once()
    pending, oldest = gauges()
    assert pending == 2 and 90 <= oldest < 120
    relay = relay_for(store, dispatcher, settings)
    relay.run_once()
    depths.run_once()
    assert gauges() == (0.0, 0.0)
    depths.clear()


def test_keyed_jobs_are_pushed_only_as_their_keys_head(
        engine: Engine, store: Store, dispatcher: Dispatcher, settings: Settings) -> None:
    """Announced or drained, a job behind its key's head is not pushed (it would be fetched,
    refused and acked away) and its row is forgotten: the turn's push brings it."""
    waiting = [enqueue_committed(engine, ordering_key="k") for _ in range(2)]  # a drain's
    relay = relay_for(store, dispatcher, settings)
    with running(relay):
        wait_for(lambda: relay.listens == 1 and outbox(store) == 0, message="the start drain")
        assert ready(dispatcher) == [waiting[0]]
        with engine.begin() as conn:  # announced: a key's line, another key, no key
            line = [str(taskline.enqueue(conn, "echo", ordering_key="k2")) for _ in range(3)]
            other = str(taskline.enqueue(conn, "echo", ordering_key="k3"))
            plain = str(taskline.enqueue(conn, "echo"))
        wait_for(lambda: outbox(store) == 0, message="the rows to go")
        assert sorted(ready(dispatcher)) == sorted([waiting[0], line[0], other, plain])
    assert store.get_job(uuid.UUID(line[2])).status == "queued"
