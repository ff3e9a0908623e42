"""Self-fencing: a worker that cannot keep a lease stops that attempt and takes no new work.

Invariant: no outcome is written for an attempt after its local lease deadline (the monotonic
time its last successful renewal was sent + lease_s - Settings.fence_margin_s), because just
after it the lease may expire and the reaper give the job to someone else; and while
PostgreSQL cannot be reached the worker claims nothing, until a ping answers again. Each
lease's deadline is watched on the deadline thread, so a renewal call hanging on a dead
connection cannot delay the fence.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Iterable, Sequence

from taskline.errors import StoreUnavailable
from taskline.execution.attempts import Attempt, Attempts, Settler
from taskline.execution.deadlines import Deadlines
from taskline.store.store import Store

log = logging.getLogger(__name__)

PING_BACKOFF_S = (0.05, 2.0)


class Fence:
    """Watches lease deadlines and gates new work on PostgreSQL being reachable."""

    def __init__(self, store: Store, deadlines: Deadlines, attempts: Attempts) -> None:
        self._store = store
        self._deadlines = deadlines
        self._attempts = attempts
        self._tripped = threading.Event()

    @property
    def tripped(self) -> bool:
        return self._tripped.is_set()

    def trip(self, reason: str) -> None:
        """Take no new work until PostgreSQL answers again."""
        if not self._tripped.is_set():
            log.error("self-fenced: taking no new work until PostgreSQL answers",
                      extra={"action": "fence", "reason": reason})
        self._tripped.set()

    def watch(self, attempt: Attempt) -> None:
        """(Re-)arm the check of `attempt`'s local lease deadline."""
        self.watch_many((attempt,))

    def watch_many(self, attempts: Sequence[Attempt]) -> None:
        """`watch` each of `attempts`, with one pass over the deadline lock for all."""
        self._deadlines.cancel_many(a.lease_check for a in attempts)
        checks = self._deadlines.call_many(
            [(a.lease_deadline, functools.partial(self._check, a)) for a in attempts])
        for attempt, check in zip(attempts, checks, strict=True):
            attempt.lease_check = check

    def forget(self, attempt: Attempt) -> None:
        self.forget_many((attempt,))

    def forget_many(self, attempts: Iterable[Attempt]) -> None:
        self._deadlines.cancel_many(a.lease_check for a in attempts)

    def _check(self, attempt: Attempt) -> None:
        if attempt.lost or attempt.fenced or not self._attempts.holds(attempt):
            return  # PostgreSQL already told us it is not ours, or we are done with it
        if time.monotonic() < attempt.lease_deadline:
            return  # renewed since this check was armed
        attempt.fenced = True
        attempt.stop()
        # Winning the settlement means the handler is still running: it is discarded when it
        # returns or is abandoned. Losing it means an outcome is queued, which the recorder
        # now refuses to write because the lease is no longer valid.
        attempt.settle(Settler.FENCE)
        log.error("lease lapsed without renewal: attempt stopped, outcome will not be recorded",
                  extra=attempt.log_extra("self_fence"))
        self.trip(f"lease of job {attempt.job_id} lapsed")

    def recover(self, stop: threading.Event) -> bool:
        """Ping PostgreSQL with backoff until it answers (True) or `stop` is set (False)."""
        delay, cap = PING_BACKOFF_S
        while not stop.is_set():
            try:
                self._store.ping()
            except StoreUnavailable:
                stop.wait(delay)
                delay = min(delay * 2, cap)
                continue
            self._tripped.clear()
            log.warning("PostgreSQL answers again: taking work", extra={"action": "unfence"})
            return True
        return False
