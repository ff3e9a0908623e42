"""Leadership: only one maintenance instance acts at a time.

The lease is a row in PostgreSQL (`leader_leases`, name "maintenance"), taken or renewed by
`Store.acquire_leader`, which compares expiry in PostgreSQL's clock, so no two hosts' clocks
have to agree. The holder renews every ttl/3.

Invariant: this instance acts only while it believes it holds the lease, and it believes so
strictly less long than PostgreSQL grants it. A renewal that fails (PostgreSQL unreachable)
or is refused (someone else holds the lease) ends leadership at once; a renewal that hangs
ends it when the local validity window runs out: `VALID_FRACTION` of the ttl measured on the
monotonic clock from *before* the renewal was sent, which is earlier than the moment
PostgreSQL started the lease. Another instance can only take over after the ttl has passed
in PostgreSQL time, by which point this one has stopped starting passes.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from taskline import metrics
from taskline.service import Periodic
from taskline.settings import Settings
from taskline.store.views import MaintenanceStore

log = logging.getLogger(__name__)

LEADER_NAME = "maintenance"
MIN_TTL_S = 5.0
"""Shortest leadership lease, seconds: a brief PostgreSQL hiccup must not flip leaders."""
TTL_REAPER_INTERVALS = 3
"""The lease lasts this many reaper intervals (or MIN_TTL_S, whichever is longer)."""
VALID_FRACTION = 0.8
"""Part of the ttl this instance trusts a renewal for; leaves room for two more renewals."""


def leader_ttl(settings: Settings) -> float:
    """The leadership lease: 3 reaper intervals, at least MIN_TTL_S (15 s by default)."""
    return max(TTL_REAPER_INTERVALS * settings.reaper_interval_s, MIN_TTL_S)


def instance_id() -> str:
    """A holder name unique to this process: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class LeaderResult:
    """The outcome of one acquire-or-renew round."""

    held: bool
    changed: bool


class Leader(Periodic):
    """Takes and keeps the maintenance lease; `holds()` gates every component's pass.
    `run(stop)` renews every ttl/3; the caller releases once its components stopped."""

    name = "leader"

    def __init__(self, store: MaintenanceStore, ttl_s: float, holder: str | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.store = store
        self.ttl_s = ttl_s
        self.holder = holder or instance_id()
        self._clock = clock
        self._lock = threading.Lock()
        self._held = False
        self._valid_until = 0.0

    @property
    def interval_s(self) -> float:
        return self.ttl_s / 3

    def holds(self) -> bool:
        """True while this instance holds the lease and its last renewal is still trusted."""
        with self._lock:
            return self._held and self._clock() < self._valid_until

    def run_once(self) -> LeaderResult:
        """Acquire or renew the lease; any failure ends leadership before it is raised."""
        sent = self._clock()
        was = self.holds()
        try:
            held = self.store.acquire_leader(LEADER_NAME, self.holder, self.ttl_s)
        except Exception:
            self._set(False, 0.0)
            if was:
                log.warning("maintenance leadership lost: renewal failed",
                            extra={"action": "leader", "holder": self.holder})
            raise
        self._set(held, sent + self.ttl_s * VALID_FRACTION)
        if held != was:
            log.info("maintenance leadership %s", "taken" if held else "lost to another instance",
                     extra={"action": "leader", "holder": self.holder})
        return LeaderResult(held=held, changed=held != was)

    def release(self) -> None:
        """Give the lease up so a standby takes over at once instead of after the ttl."""
        with self._lock:
            was = self._held
        self._set(False, 0.0)
        if not was:
            return
        try:
            self.store.release_leader(LEADER_NAME, self.holder)
            log.info("maintenance leadership released",
                     extra={"action": "leader", "holder": self.holder})
        except Exception as err:
            # The lease then simply expires after its ttl.
            log.warning("could not release leadership: %s", err, extra={"action": "leader"})

    def _set(self, held: bool, valid_until: float) -> None:
        with self._lock:
            self._held = held
            self._valid_until = valid_until
        metrics.maintenance().leader.set(1 if held else 0)
