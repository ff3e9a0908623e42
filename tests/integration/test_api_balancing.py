"""`taskline api` with two gunicorn processes places keep-alive connections by least
connections (taskline_producer.http.balancer), and a stopped or replaced process costs no
connection.

Invariant checked: after each new connection the processes' counts differ by at most one; a
process that stops turning its event loop delays new connections by at most MAX_YIELD_S and
then stops counting, so every connection is still answered; a replacement process gets the
connections its predecessor's slot would have.
"""

from __future__ import annotations

import http.client
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from taskline.settings import Settings
from taskline_cli.localservers import free_port
from taskline_producer.http.balancer import MAX_YIELD_S
from tests.helpers import (
    connections_per_process,
    every_process_serving,
    service,
    service_env,
    wait_for,
)

pytestmark = pytest.mark.slow


class Api:
    """A running `taskline api --workers 2` and the keep-alive connections opened to it."""

    def __init__(self, pid: int, port: int) -> None:
        self.pid, self.port = pid, port
        self.open: list[http.client.HTTPConnection] = []

    def connect(self) -> float:
        """Open one more connection, answered once; returns the seconds its answer took."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        started = time.monotonic()
        conn.request("GET", "/healthz")
        response = conn.getresponse()
        response.read()
        assert response.status == 200
        self.open.append(conn)
        return time.monotonic() - started

    def serving(self) -> bool:
        """Whether both processes serve (then each takes its share of new connections)."""
        return every_process_serving(self.pid, self.port, 2)

    def counts(self) -> dict[int, int]:
        return connections_per_process(self.pid, self.port)

    def close_all(self) -> None:
        for conn in self.open:
            conn.close()
        self.open.clear()
        wait_for(lambda: sum(self.counts().values()) == 0, message="connections closed")


@pytest.fixture
def api(settings: Settings, tmp_path: Path) -> Iterator[Api]:
    port = free_port()
    env = service_env(settings, PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "metrics"))
    with service(["api", "--bind", f"127.0.0.1:{port}", "--workers", "2"], env,
                 tmp_path / "logs") as proc:
        running = Api(proc.pid, port)
        wait_for(running.serving, timeout=20, message="both api processes up")
        yield running
        running.close_all()


def assert_balanced(api: Api, total: int) -> None:
    counts = api.counts()
    assert sum(counts.values()) == total and max(counts.values()) - min(counts.values()) <= 1, \
        counts


def test_keep_alive_connections_spread_evenly(api: Api) -> None:
    for opened in range(1, 11):
        api.connect()
        assert_balanced(api, opened)


def test_a_stopped_process_delays_new_connections_but_loses_none(api: Api) -> None:
    api.connect()
    stopped = next(pid for pid, n in api.counts().items() if n == 0)
    os.kill(stopped, signal.SIGSTOP)
    try:
        # The stopped process still counts (its last beat is fresh) and holds fewer
        # connections, so the other one yields each new connection, then takes it anyway.
        delays = [api.connect() for _ in range(3)]
        assert api.counts()[stopped] == 0
        assert all(delay >= MAX_YIELD_S * 0.8 for delay in delays), delays
        assert all(delay < 2.0 for delay in delays), delays
    finally:
        os.kill(stopped, signal.SIGCONT)
    # Awake again, it takes the next connections until the two are even.
    for _ in range(4):
        api.connect()
    assert api.counts()[stopped] == 4
    assert_balanced(api, 8)


def test_a_stopping_process_is_not_waited_for(api: Api) -> None:
    for _ in range(3):
        api.connect()
    stopping = min(api.counts(), key=api.counts().get)  # holds 1, its sibling 2
    os.kill(stopping, signal.SIGTERM)
    # It keeps its kept-alive connection for up to 2 s while it stops, and accepts nothing
    # more: its sibling, holding more, must not leave the new connections to it.
    # Waiting for it would cost every one MAX_YIELD_S; the median allows one slow answer.
    delays = sorted(api.connect() for _ in range(5))
    assert delays[2] < MAX_YIELD_S * 0.8, delays


def test_a_replacement_process_takes_connections(api: Api) -> None:
    for _ in range(2):
        api.connect()
    killed = next(iter(api.counts()))
    os.kill(killed, signal.SIGKILL)
    api.close_all()
    wait_for(lambda: killed not in api.counts() and api.serving(), timeout=20,
             message="gunicorn to replace the killed process")
    for opened in range(1, 5):
        api.connect()
        assert_balanced(api, opened)
