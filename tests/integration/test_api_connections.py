"""How one API process uses PostgreSQL under concurrent enqueues: a burst opens the pool once
and later bursts reuse it, and single enqueues waiting together are written by one statement.

A PostgreSQL connection costs a backend start; before the pool lost its overflow, every
connection above five was closed when returned and opened again by the next burst.
"""

from __future__ import annotations

import threading
import uuid

import psycopg
from flask import Flask
from sqlalchemy import event
from werkzeug.test import TestResponse

from taskline.dispatch.dispatcher import Dispatcher
from taskline.dispatch.keys import QueueKeys
from taskline.settings import Settings
from taskline_producer.operations.backends import POOL_SIZE
from tests.helpers import wait_for

BURST = POOL_SIZE + 2  # more requests at once than the pool has connections
ROUNDS = 3


class PoolWatch:
    """Counts the connections the pool opens and the most it lends at once."""

    def __init__(self) -> None:
        self.opened = 0
        self.lent = 0
        self.most_lent = 0
        self._lock = threading.Lock()

    def on_connect(self, *_: object) -> None:
        with self._lock:
            self.opened += 1

    def on_checkout(self, *_: object) -> None:
        with self._lock:
            self.lent += 1
            self.most_lent = max(self.most_lent, self.lent)

    def on_checkin(self, *_: object) -> None:
        with self._lock:
            self.lent -= 1


def _enqueue_keyed(app: Flask) -> int:
    """A keyed single enqueue: written alone, on a connection of its own (unkeyed ones that
    arrive together share one write, taskline_producer.operations.grouping)."""
    response = app.test_client().post("/api/v1/jobs", json={"type": "noop"},
                                      headers={"Idempotency-Key": str(uuid.uuid4())})
    return response.status_code


def _burst(app: Flask, watch: PoolWatch, database_url: str) -> list[int]:
    """BURST enqueues at once while a lock holds every insert, so each request keeps its
    connection until the pool is empty and the rest wait for one; the statuses answered."""
    statuses: list[int] = []
    with psycopg.connect(database_url) as blocker:
        blocker.execute("LOCK TABLE taskline.jobs IN SHARE MODE")
        threads = [threading.Thread(target=lambda: statuses.append(_enqueue_keyed(app)))
                   for _ in range(BURST)]
        for thread in threads:
            thread.start()
        wait_for(lambda: watch.lent == POOL_SIZE, interval=0.01, message="the pool lent out")
        blocker.commit()  # releases the lock: every insert proceeds
    for thread in threads:
        thread.join(timeout=15)
    return statuses


def test_concurrent_bursts_reuse_the_pooled_connections(app: Flask, settings: Settings) -> None:
    with app.app_context():
        engine = app.extensions["taskline"].store.engine
    watch = PoolWatch()
    for name in ("connect", "checkout", "checkin"):
        event.listen(engine, name, getattr(watch, f"on_{name}"))

    for _ in range(ROUNDS):
        statuses = _burst(app, watch, settings.database_url)
        assert statuses == [201] * BURST

    assert watch.most_lent == POOL_SIZE  # the bursts did use the whole pool at once
    assert watch.opened == POOL_SIZE  # and opened it only once over all the rounds


def test_single_enqueues_waiting_together_are_written_by_one_statement(
        app: Flask, settings: Settings, dispatcher: Dispatcher) -> None:
    with app.app_context():
        backend = app.extensions["taskline"]
        engine, writer = backend.store.engine, backend.enqueuer.group
    watch = PoolWatch()
    for name in ("checkout", "checkin"):
        event.listen(engine, name, getattr(watch, f"on_{name}"))
    answers: list[TestResponse] = []

    def enqueue(n: int) -> None:
        answers.append(app.test_client().post("/api/v1/jobs",
                                              json={"type": "noop", "payload": {"n": n}}))

    with psycopg.connect(settings.database_url) as blocker:
        blocker.execute("LOCK TABLE taskline.jobs IN SHARE MODE")  # holds the first write
        threads = [threading.Thread(target=enqueue, args=(n,)) for n in range(BURST)]
        threads[0].start()
        wait_for(lambda: watch.lent == 1)
        for thread in threads[1:]:
            thread.start()
        wait_for(lambda: writer.waiting == BURST - 1)
        blocker.commit()
    for thread in threads:
        thread.join(timeout=15)

    assert sorted(a.status_code for a in answers) == [201] * BURST
    assert watch.most_lent == 1  # one write in flight at a time, on one connection
    ids = {a.get_json()["id"] for a in answers}
    assert len(ids) == BURST
    assert {a.get_json()["payload"]["n"] for a in answers} == set(range(BURST))
    with psycopg.connect(settings.database_url) as conn:
        events = conn.execute("SELECT job_id::text FROM taskline.job_events WHERE event = "
                              "'enqueued'")
        assert {row[0] for row in events} == ids
    ready = dispatcher.client.lrange(QueueKeys("default").ready(5), 0, -1)  # default priority
    assert sorted(ready) == sorted(ids)
