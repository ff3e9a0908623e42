"""The lease keeper: extends every lease this worker holds, in one statement per period.

Invariant: a lease is renewed only while its attempt may still report (not lost, fenced, timed
out or handed back). A lease PostgreSQL no longer returns is not ours any more (the reaper took
it, or the job left `running`): that attempt is told to stop and its outcome will be rejected
by fencing. A returned lease whose job has a cancel request stops its attempt cooperatively.
A failed renewal changes nothing here: the self-fence watches each lease's deadline. Nor does a
lease skipped because its row is locked (its outcome is being written): the statement never
waits for it, so one slow outcome cannot hold back the renewal of the others.

An attempt starts with its lease already partly spent: it runs from the claim's send, and the
claim's round trips (and any wait to start) come first. One started with less than two periods
of it left is renewed by a pass at once, not up to a period later: by then, on a slow link, the
renewal's answer could come back after the self-fence's deadline, fencing a live lease.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from taskline.errors import StoreUnavailable
from taskline.execution.attempts import Attempt, Attempts
from taskline.metrics import LEASE_RENEWALS
from taskline.service import Periodic
from taskline.settings import Settings
from taskline.store.store import Store

log = logging.getLogger(__name__)


class LeaseKeeper(Periodic):
    """Renews held leases every `settings.renew_every_s`; `run(stop)` is its loop."""

    name = "lease_keeper"
    fixed_rate = True  # a slow pass must not push the next one past the lease's margin

    def __init__(self, *, store: Store, worker_id: str, settings: Settings, attempts: Attempts,
                 on_renewed: Callable[[Attempt], None]) -> None:
        super().__init__()
        self._store = store
        self._worker_id = worker_id
        self._lease_s = settings.lease_s
        self._every_s = settings.renew_every_s
        self._margin_s = settings.fence_margin_s
        self._attempts = attempts
        self._on_renewed = on_renewed
        self._woken = threading.Event()

    @property
    def interval_s(self) -> float:
        return self._every_s

    def started(self, attempts: Sequence[Attempt]) -> None:
        """Attempts just started: renew at once if one has less than two periods left."""
        soon = time.monotonic() + 2 * self._every_s
        if any(a.lease_deadline < soon for a in attempts):
            self._woken.set()

    def wake(self) -> None:
        """End the wait before the next pass now (a pass, or the loop's end once stopped)."""
        self._woken.set()

    def sleep(self, stop: threading.Event, seconds: float) -> None:
        if not stop.is_set():
            self._woken.wait(seconds)
            self._woken.clear()

    def run_once(self) -> dict[str, int]:
        """One renewal round trip; returns counts by result (ok, lost, error)."""
        held = [a for a in self._attempts.snapshot() if a.renewable]
        if not held:
            return {}
        sent_at = time.monotonic()
        try:
            kept = self._store.renew_leases([a.lease_id for a in held], self._worker_id,
                                            self._lease_s)
        except StoreUnavailable as err:
            LEASE_RENEWALS.labels("error").inc(len(held))
            log.warning("lease renewal failed", extra={"action": "renew", "error": str(err),
                                                       "leases": len(held)})
            return {"error": len(held)}
        counts = {"ok": 0, "lost": 0}
        for attempt in held:
            if attempt.lease_id in kept:
                cancel_requested = kept[attempt.lease_id]
                if cancel_requested is None:
                    continue  # locked by its outcome's transaction: still ours, tried next pass
                counts["ok"] += 1
                self._keep(attempt, sent_at, cancel_requested=cancel_requested)
            elif attempt.settled_by is None:
                counts["lost"] += 1
                self._lose(attempt)
        for result, n in counts.items():
            if n:
                LEASE_RENEWALS.labels(result).inc(n)
        return counts

    def _keep(self, attempt: Attempt, sent_at: float, *, cancel_requested: bool) -> None:
        attempt.renewed(sent_at, self._lease_s, self._margin_s)
        self._on_renewed(attempt)
        if cancel_requested and not attempt.cancel_requested:
            log.info("cancel requested: stopping the handler",
                     extra=attempt.log_extra("cancel_requested"))
            attempt.request_cancel()

    def _lose(self, attempt: Attempt) -> None:
        # A lease we have already recorded is simply gone; only an unsettled one is lost.
        attempt.lost = True
        attempt.stop()
        log.warning("lease lost: stopping the handler; its outcome will be rejected",
                    extra=attempt.log_extra("lease_lost"))
