"""The lapser: cancels jobs not started by their `expires_at` (or `start_within_s`).

Invariant: the claim rule already refuses a job past its expiry (in PostgreSQL's clock), so a
lapsed job is never leased whatever this loop does; this loop makes the end visible, moving
each such job from queued, scheduled or retrying to cancelled with the event `lapsed`, within
INTERVAL_S of its expiry while this instance leads. A running job is not affected (the lapse
is fenced on the states it leaves). A lapsed workflow step cancels its waiting dependents and
counts for its `when` steps, as a cancellation does, in the same transaction. Redis follows
after the commit (out of the retry and scheduled sets; ready-list copies are refused by the
claim and removed by reconciliation), as for a cancel; a lapsed head of an ordering key passes
its turn there too (its key's next job is pushed when it is now the head).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from taskline import transitions
from taskline.dispatch.dispatcher import Dispatcher
from taskline.errors import StoreUnavailable
from taskline.jobs import Job, Status
from taskline.metrics import JOBS_LAPSED, ORDERING_TURNS, LabelGuard
from taskline.mirror import Mirror
from taskline.service import Periodic
from taskline.store.views import MaintenanceStore
from taskline.transitions import Committed

log = logging.getLogger(__name__)

INTERVAL_S = 0.5
"""How often it looks: a job lapses within this of its expiry (the contract says 1 s)."""
PAGE_SIZE = 500


@dataclass(frozen=True)
class LapseResult:
    lapsed: int


class Lapser(Periodic):
    """Cancels expired jobs that have not started, a page per transaction."""

    name = "lapser"

    def __init__(self, store: MaintenanceStore, dispatcher: Dispatcher, *,
                 queues: Callable[[str], str] | None = None) -> None:
        super().__init__()
        self.store = store
        self.mirror = Mirror.of(dispatcher, store)
        self.queue_label = queues or LabelGuard()

    @property
    def interval_s(self) -> float:
        return INTERVAL_S

    def run_once(self) -> LapseResult:
        total = 0
        while True:
            lapsed, dependents = self.store.lapse_due(PAGE_SIZE)
            self._follow(lapsed, dependents)
            total += len(lapsed)
            if len(lapsed) < PAGE_SIZE:
                return LapseResult(total)

    def _turns(self, lapsed: list[Job]) -> list[Committed]:
        """The keys' next heads the lapsed jobs passed the turn to (read after the commit);
        if PostgreSQL cannot say, a worker's budgeted claim finds them within a second."""
        try:
            turns = self.store.turns_after(lapsed)
        except StoreUnavailable as err:
            log.warning("could not read the turns lapsed jobs passed", extra={
                "action": "lapse", "error": str(err)})
            return []
        ORDERING_TURNS.inc(len(turns))
        return [t.committed() for t in turns]

    def _follow(self, lapsed: list[Job], dependents: list[Job]) -> None:
        if not lapsed:
            return
        self.mirror.follow(
            [Committed(transitions.LAPSE, str(j.id), j.queue, j.priority) for j in lapsed]
            + [Committed(transitions.UNBLOCK if j.status is Status.QUEUED else transitions.CANCEL,
                         str(j.id), j.queue, j.priority) for j in dependents]
            + self._turns(lapsed), action="lapse")
        for queue, count in Counter(j.queue for j in lapsed).items():
            JOBS_LAPSED.labels(queue=self.queue_label(queue)).inc(count)
        for job in lapsed:
            log.info("job lapsed: not started by its expiry", extra={
                "action": "lapsed", "job_id": str(job.id), "queue": job.queue,
                "expires_at": job.expires_at.isoformat() if job.expires_at else None})
