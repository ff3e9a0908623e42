"""The API process keeps its PostgreSQL connections: a burst of concurrent requests opens the
pool once, and later bursts reuse it instead of opening and closing connections.

A PostgreSQL connection costs a backend start; before the pool lost its overflow, every
connection above five was closed when returned and opened again by the next burst.
"""

from __future__ import annotations

import threading
import time

import psycopg
from flask import Flask
from sqlalchemy import event

from taskline.settings import Settings
from taskline_producer.backends import POOL_SIZE

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


def _burst(app: Flask, watch: PoolWatch, database_url: str) -> list[int]:
    """BURST enqueues at once while a lock holds every insert, so each request keeps its
    connection until the pool is empty and the rest wait for one; the statuses answered."""
    statuses: list[int] = []
    with psycopg.connect(database_url) as blocker:
        blocker.execute("LOCK TABLE jobs IN SHARE MODE")
        threads = [threading.Thread(target=lambda: statuses.append(
            app.test_client().post("/api/v1/jobs", json={"type": "noop"}).status_code))
            for _ in range(BURST)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 10
        while watch.lent < POOL_SIZE and time.monotonic() < deadline:
            time.sleep(0.01)
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
