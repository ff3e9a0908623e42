"""The breaker: once Redis failed to answer, calls fail at once until a probe answers again.

Invariant: an open breaker sends nothing to Redis from this process's clients; a daemon probe
(its own connection, short timeouts, outside the breaker) pings every `PROBE_S` and closes the
breaker on the first answer. So while Redis is down or blackholed, a push, ack or fetch costs
microseconds instead of a connect or socket timeout, and nothing waits for the probe: the
first call after the answer goes through. A failure is a connection error or a socket timeout,
never an error reply (a script error says Redis is up).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import redis
from redis.connection import Connection

log = logging.getLogger(__name__)

PROBE_S = 0.2
"""Pause between probes while the breaker is open, seconds."""


class Breaker:
    """Open after a failure, closed again by the first probe Redis answers."""

    def __init__(self, probe: Callable[[], object], probe_s: float = PROBE_S) -> None:
        self._probe = probe
        self._probe_s = probe_s
        self._lock = threading.Lock()
        self._open = False
        self._stop = threading.Event()

    @property
    def open(self) -> bool:
        return self._open

    def check(self) -> None:
        """Raise the driver's own connection error while open (translated at the boundary)."""
        if self._open:
            raise redis.ConnectionError("Redis marked unreachable by a recent failure")

    def failed(self) -> None:
        with self._lock:
            if self._open or self._stop.is_set():
                return
            self._open = True
        threading.Thread(target=self._probe_until_answered, name="taskline-redis-probe",
                         daemon=True).start()

    def close(self) -> None:
        """Stop probing for good (the dispatcher is closing)."""
        self._stop.set()

    def _probe_until_answered(self) -> None:
        while not self._stop.wait(self._probe_s):
            try:
                self._probe()
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                continue
            except redis.ResponseError:
                continue  # LOADING and the like: up, not ready
            with self._lock:
                self._open = False
            return


class GuardedConnection(Connection):
    """A connection that asks its breaker before connecting or sending, and reports to it every
    connection error and socket timeout."""

    _bound: Breaker | None = None

    def __init__(self, *args: Any, breaker: Breaker | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        found = breaker or self._bound
        if found is None:
            raise TypeError("GuardedConnection needs a breaker")
        self._breaker = found

    @classmethod
    def bound(cls, breaker: Breaker) -> type[GuardedConnection]:
        """This class with `breaker` built in: redis-py's cluster client passes no unknown
        keyword on to the connections of its nodes, only the connection class."""
        return type(cls.__name__, (cls,), {"_bound": breaker})

    def connect(self) -> None:
        self._breaker.check()
        self._watched(super().connect)

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        self._breaker.check()
        self._watched(lambda: super(GuardedConnection, self).send_packed_command(
            command, check_health))

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        return self._watched(lambda: super(GuardedConnection, self).read_response(
            *args, **kwargs))

    def _watched(self, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except (redis.ConnectionError, redis.TimeoutError):
            self._breaker.failed()
            raise
