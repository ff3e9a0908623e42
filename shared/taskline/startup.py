"""Starting a worker or maintenance before PostgreSQL answers: wait for it, say so, and say
whether the process is ready (`/readyz` on its metrics port).

Invariant: a service started while PostgreSQL is unreachable (a host reboot, a compose or
Kubernetes start that brings the database up after the services) neither exits nor works
half-started: it retries its first contact with capped, jittered backoff, logs what it waits
for and why (the driver's message), answers 503 on `/readyz` meanwhile, and starts working on
the first answer. A stop signal ends the wait at once, even while an attempt hangs in a
connect: attempts run on a daemon thread, and the caller returns as soon as `stop` is set.
Redis is not waited for: without it, work goes on from PostgreSQL (docs/worker.md).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import tenacity

from taskline.errors import DispatchUnavailable, StoreUnavailable, detail

log = logging.getLogger(__name__)

FIRST_WAIT_S = 0.5
"""The first pause between two attempts, seconds; each later one doubles, up to MAX_WAIT_S."""
MAX_WAIT_S = 5.0
"""The longest pause between two attempts, seconds: a server that comes back is used within
about this long, and a fleet of waiting processes costs it one connection attempt each."""
LOG_EVERY_S = 30.0
"""After the first failed attempt, how often the wait is logged again, seconds."""
POLL_S = 0.05
"""How often the caller looks at `stop` while an attempt runs, seconds."""
UNREACHABLE = (StoreUnavailable, DispatchUnavailable)


def _none() -> None:
    return None


class Readiness:
    """What `/readyz` answers: 503 while starting, waiting, stopping or while `unavailable()`
    names a reason; else 200, "degraded" while `degraded()` names one (Redis unreachable)."""

    def __init__(self, degraded: Callable[[], str | None] = _none,
                 unavailable: Callable[[], str | None] = _none) -> None:
        self._degraded = degraded
        self._unavailable = unavailable
        # (status, {server: why it is waited for}), replaced whole: a probe on another
        # thread reads one consistent pair.
        self._state: tuple[str, dict[str, str]] = ("starting", {})

    @property
    def status(self) -> str:
        return self._state[0]

    def waiting(self, server: str, reason: str) -> None:
        self._state = ("waiting", {server: reason})

    def working(self) -> None:
        if self._state[0] != "stopping":  # a signal during the last attempt wins
            self._state = ("ready", {})

    def stopping(self) -> None:
        self._state = ("stopping", {})

    def answer(self) -> tuple[int, dict[str, Any]]:
        """(HTTP status, JSON body) of `/readyz`."""
        status, checks = self._state
        if status != "ready":
            body: dict[str, Any] = {"status": status}
            if checks:
                body.update(waiting_for=next(iter(checks)), checks=checks)
            return 503, body
        reason = self._unavailable()
        if reason:
            return 503, {"status": "unavailable", "reason": reason}
        reason = self._degraded()
        return 200, {"status": "degraded", "reason": reason} if reason else {"status": "ready"}


class _Stopped(Exception):
    """`stop` was set before an attempt began."""


def wait_for(server: str, attempt: Callable[[], object], stop: threading.Event,
             readiness: Readiness | None = None) -> bool:
    """Call `attempt` until it does not raise StoreUnavailable or DispatchUnavailable: True
    once it returned, False as soon as `stop` is set. Any other error is raised here.

    `server` names what is waited for in logs and in `/readyz` ("PostgreSQL").
    """
    waiting = _Wait(server, stop, readiness)
    outcome: list[BaseException | None] = []

    def body() -> None:
        try:
            waiting.run(attempt)
            outcome.append(None)
        except (_Stopped, *UNREACHABLE):
            pass  # stopped while waiting
        except BaseException as err:  # raised again on the caller's thread
            outcome.append(err)

    thread = threading.Thread(target=body, name=f"taskline-wait-{server.lower()}", daemon=True)
    thread.start()
    while thread.is_alive() and not stop.is_set():
        thread.join(POLL_S)
    if stop.is_set() or not outcome:
        return False
    if outcome[0] is not None:
        raise outcome[0]
    return True


class _Wait:
    """One wait for one server: the retry loop, and what it logs and tells `readiness`."""

    def __init__(self, server: str, stop: threading.Event, readiness: Readiness | None) -> None:
        self.server, self.stop, self.readiness = server, stop, readiness
        self.started = time.monotonic()
        self.failures = 0
        self.logged = float("-inf")

    def run(self, attempt: Callable[[], object]) -> None:
        tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(UNREACHABLE),
            wait=tenacity.wait_exponential_jitter(initial=FIRST_WAIT_S, max=MAX_WAIT_S,
                                                  jitter=FIRST_WAIT_S),
            stop=tenacity.stop_when_event_set(self.stop), sleep=self.stop.wait,
            before_sleep=self._failed, reraise=True)(self._unless_stopped, attempt)
        if self.failures:
            log.warning("%s answers: starting", self.server, extra=self._fields())

    def _unless_stopped(self, attempt: Callable[[], object]) -> object:
        # tenacity sleeps through stop.wait, which returns early on a stop, and then tries
        # once more before it looks at `stop`: that attempt must not begin (it could register
        # a worker that nothing would deregister).
        if self.stop.is_set():
            raise _Stopped
        return attempt()

    def _failed(self, state: tenacity.RetryCallState) -> None:
        self.failures += 1
        err = state.outcome.exception() if state.outcome is not None else None
        if self.readiness is not None:  # the short message: /readyz answers anyone
            self.readiness.waiting(self.server, str(err))
        now = time.monotonic()
        if now - self.logged >= LOG_EVERY_S:
            self.logged = now
            log.warning("waiting for %s", self.server,
                        extra={**self._fields(), "error": detail(err) if err else None})

    def _fields(self) -> dict[str, Any]:
        return {"action": "wait", "server": self.server, "failed_attempts": self.failures,
                "waited_s": round(time.monotonic() - self.started, 1)}
