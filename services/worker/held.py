"""Held work: the limited jobs this worker claims from PostgreSQL under their flow budgets,
and the jobs with an ordering key, which start only through the same claim, as their key's head.

Invariant: a job a flow limit applies to is started only by `Store.claim_held`, which takes
budget under the limits' row locks; Redis never starts one (the plain claim refuses it and the
loop acks its id away: it stays `queued`, consuming no attempt and writing nothing). This
object only decides when trying is worth a transaction, so a worker never spins on a full
budget: after the limits change, when a claim refused a limited id, when one of the attempts it
started ends (its lease released: budget freed), or when a full rate window frees. With no
limit defined it costs one small query a second and nothing on the claim path, until a claim
refuses a keyed job.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence

from taskline.dispatch.dispatcher import Dispatcher
from taskline.errors import DispatchUnavailable, StoreUnavailable
from taskline.metrics import HELD_CLAIMS
from taskline.store.store import Claimed
from taskline.store.views import WorkerStore
from taskline.transitions import Committed

log = logging.getLogger(__name__)

REFRESH_S = 1.0
"""How often the set of limited scopes is read: a new or removed limit binds within this."""
RETRY_S = 1.0
"""Longest wait before trying a full concurrency budget again (peers' ends wake us sooner)."""


class HeldWork:
    """When to run the budgeted claim, and running it; safe to call from any thread."""

    def __init__(self, store: WorkerStore, dispatcher: Dispatcher, worker_id: str,
                 queues: Sequence[str], lease_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._dispatcher = dispatcher
        self._worker_id = worker_id
        self._queues = list(queues)
        self._lease_s = lease_s
        self._clock = clock
        self._lock = threading.Lock()
        self._scopes: frozenset[str] = frozenset()
        self._read_at = float("-inf")
        # Keyed jobs waiting in PostgreSQL since before this worker started are found only here.
        self._pending = True
        self._next_try = 0.0
        self._started: dict[str, str] = {}  # job id -> queue, for the attempts started here
        self._keyed: set[str] = set()  # keyed jobs this worker claimed from Redis, running

    def active(self) -> bool:
        """Whether any flow limit exists (read at most once a second)."""
        now = self._clock()
        if now - self._read_at >= REFRESH_S:
            self._read_at = now
            try:
                scopes = frozenset(self._store.flow_limit_scopes())
            except StoreUnavailable:
                return bool(self._scopes)
            with self._lock:
                if scopes != self._scopes and scopes:
                    self._pending, self._next_try = True, now
                self._scopes = scopes
        return bool(self._scopes)

    def due(self) -> bool:
        """Whether the budgeted claim is worth running now."""
        self.active()  # a new limit wakes the claim; a refused keyed job does without limits
        with self._lock:
            return self._pending and self._clock() >= self._next_try

    def timed(self) -> bool:
        """Whether a flow limit exists, so held work may wait for a budget that frees at an
        instant (a rate window); without one only keyed jobs wait, and their look is a
        backstop that need not be on time."""
        with self._lock:
            return bool(self._scopes)

    def wait_s(self, default: float) -> float:
        """How long an idle loop may block in Redis before it should try held work again."""
        with self._lock:
            if not self._pending:
                return default
            return max(min(default, self._next_try - self._clock()), 0.0)

    def refused(self) -> None:
        """A claim refused limited ids: there is held work, maybe within budget."""
        self._wake_here()

    def keyed_started(self, job_ids: Iterable[str]) -> None:
        """Keyed jobs claimed from Redis (their turn's push) started here."""
        with self._lock:
            self._keyed.update(job_ids)

    def ended(self, committed: Iterable[Committed]) -> None:
        """Attempts' outcomes committed: those started here freed budget. Peers waiting on the
        same budget are woken through their queue's signal list (one command per queue).

        A keyed job claimed from Redis that ended passed its key's turn by a push; the
        budgeted claim still looks within RETRY_S, for the job enqueued while that settle ran
        (neither saw the other committed, so neither pushed it)."""
        committed = list(committed)
        with self._lock:
            keyed = [c for c in committed if c.job_id in self._keyed]
            self._keyed.difference_update(c.job_id for c in keyed)
            if keyed:
                soon = self._clock() + RETRY_S
                self._next_try = min(self._next_try, soon) if self._pending else soon
                self._pending = True
            queues = {self._started.pop(c.job_id) for c in committed if c.job_id in self._started}
        if not queues:
            return
        self._wake_here()
        with contextlib.suppress(DispatchUnavailable):  # peers retry within RETRY_S anyway
            self._dispatcher.wake(sorted(queues))

    def claim(self, slots: int) -> list[Claimed]:
        """Claim up to `slots` held jobs within budget; [] when PostgreSQL is unreachable."""
        sent_at = self._clock()  # frees_at is judged inside the transaction, not after it
        try:
            result = self._store.claim_held(self._queues, slots, self._worker_id, self._lease_s)
        except StoreUnavailable as err:
            log.warning("budgeted claim failed; retrying in %.0f s", RETRY_S,
                        extra={"action": "claim_held", "error": str(err)})
            self._retry_in(RETRY_S)
            return []
        HELD_CLAIMS.inc(len(result.claimed))
        with self._lock:
            self._started.update((str(c.job.id), c.job.queue) for c in result.claimed)
            now = self._clock()
            if not result.held:
                self._pending = False  # nothing waits: the next refusal or end says otherwise
            elif len(result.claimed) < slots:  # a budget is the bound, not our slots
                frees_in = result.frees_in_s()
                self._next_try = (now + RETRY_S if frees_in is None
                                  else sent_at + min(RETRY_S, frees_in))
            else:
                self._next_try = now
        return result.claimed

    def _wake_here(self) -> None:
        with self._lock:
            self._pending, self._next_try = True, self._clock()

    def _retry_in(self, seconds: float) -> None:
        with self._lock:
            self._pending, self._next_try = True, self._clock() + seconds
