"""The rebuilder: notices Redis coming back (or losing its content) and rebuilds it at once.

Invariant: Redis holds the rebuild marker (`taskline:dispatch:rebuilt`, `<token>:<epoch ms>`)
only while its ready lists hold every job that was queued in PostgreSQL at that instant, and
the marker only moves forward while Redis keeps what this instance wrote last. Every
`WATCH_S` the active instance renews the marker to PostgreSQL's now with a compare-and-set
(lua/renew_marker.lua): that succeeds only while Redis has stayed up with its content, so a
Redis restarted empty (no marker) or restored from an old snapshot (an older marker) fails it.
Then, once Redis has answered for `SETTLE_S` (long enough for every process's breaker to
close, so producers push again), a reconciliation pass without grace (`Reconciler.rebuild`)
pushes every queued job, and only after it the marker is written with the pass's start.
Workers claiming from PostgreSQL go back to Redis only when the marker is at least as new as
the moment they left it, so they never wait on a list that lacks a job PostgreSQL holds.
A new leader has written nothing yet, so it rebuilds once when it takes over.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass

from taskline.dispatch.dispatcher import Dispatcher
from taskline.errors import DispatchUnavailable, StoreUnavailable
from taskline.service import Periodic
from taskline.store.views import MaintenanceStore
from taskline_maintenance.reconciler import Reconciler

log = logging.getLogger(__name__)

WATCH_S = 0.25
"""Pause between marker renewals (and so the longest time to notice Redis back), seconds."""
SETTLE_S = 1.0
"""How long Redis must have answered before the rebuild starts, seconds: every process's
breaker probes every 0.2 s, so by then producers push to Redis again."""


@dataclass(frozen=True)
class RebuildResult:
    """One look at Redis: `state` is up (marker renewed), down, settling or rebuilt."""

    state: str
    missing: int = 0

    @property
    def changed(self) -> bool:
        return self.state == "rebuilt"


class Rebuilder(Periodic):
    """Renews the rebuild marker while Redis keeps its content; rebuilds Redis when it did not."""

    name = "rebuilder"

    def __init__(self, store: MaintenanceStore, dispatcher: Dispatcher, reconciler: Reconciler, *,
                 settle_s: float = SETTLE_S) -> None:
        super().__init__()
        self.store = store
        self.dispatcher = dispatcher
        self.reconciler = reconciler
        self.settle_s = settle_s
        self._token = uuid.uuid4().hex[:12]
        self._written: str | None = None
        self._answering_since: float | None = None
        self._state = "up"

    @property
    def interval_s(self) -> float:
        return WATCH_S

    def idle(self) -> None:
        self._written = None  # a standby that leads again must rebuild before vouching

    def run_once(self) -> RebuildResult:
        try:
            result = self._look()
        except (DispatchUnavailable, StoreUnavailable) as err:
            self._answering_since = None
            result = RebuildResult("down")
            if self._state != "down":
                log.warning("Redis or PostgreSQL unreachable; Redis is rebuilt once both answer",
                            extra={"action": "rebuild", "error": str(err)})
        self._state = result.state
        return result

    def _look(self) -> RebuildResult:
        now_ms = self._now_ms()
        if self._written is not None:
            renewed = f"{self._token}:{now_ms}"
            if self.dispatcher.renew_dispatch_marker(self._written, renewed):
                self._written = renewed
                self._answering_since = None
                return RebuildResult("up")
        else:
            self.dispatcher.ping()
        if self._answering_since is None:
            self._answering_since = time.monotonic()
        if time.monotonic() - self._answering_since < self.settle_s:
            return RebuildResult("settling")
        return self._rebuild()

    def _rebuild(self) -> RebuildResult:
        started_ms = self._now_ms()
        log.warning("Redis lacks a current rebuild marker (restarted, restored or new leader): "
                    "rebuilding the ready lists", extra={"action": "rebuild"})
        result = self.reconciler.rebuild()
        marker = f"{self._token}:{started_ms}"
        self.dispatcher.set_dispatch_marker(marker)
        self._written = marker
        self._answering_since = None
        missing = sum(result.missing.values())
        log.warning("Redis rebuilt: workers may dispatch from Redis again",
                    extra={"action": "rebuild", "missing": dict(result.missing),
                           "duration": round(result.duration_s, 3)})
        return RebuildResult("rebuilt", missing)

    def _now_ms(self) -> int:
        return int(self.store.now().timestamp() * 1000)
