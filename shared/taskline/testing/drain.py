"""`drain`: run every due job in this process, through the worker's own code, without Redis.

Each job is claimed by the statements a worker uses when it dispatches from PostgreSQL (the
plain claim, then the budgeted claim of limited jobs), run by the worker's handler call, and
its outcome recorded by the worker's Recorder, fenced on its lease: retries, the DLQ, released
workflow steps, flow limits and `on_complete` hooks behave as in production. Only the threads
differ: one job at a time, on the caller's thread, so a test sees its handler's effects in order;
an `async def` handler runs there too, to its end, on an event loop of its own.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from taskline.errors import Snooze
from taskline.execution import runner
from taskline.execution.attempts import Attempt, Attempts, Settler
from taskline.execution.outcomes import Recorder
from taskline.handlers import registry
from taskline.jobs import Status
from taskline.metrics import TypeLabels
from taskline.settings import Settings
from taskline.store.caller import database_url
from taskline.store.store import Claimed, Store
from taskline.testing.handlers import WORKER_ID

DRAIN_LEASE_S = 3600.0
"""The lease of a drained job: nothing renews it while its handler runs on the caller's
thread, so it outlasts any handler a test runs; the fence still names it."""
PROMOTE_BATCH = 1000
LOCKED_WAIT_S = 5.0
"""How long a drain waits for a due job's row that another transaction holds (a waiter flags
the job it waits for, holding its row for a moment) before it ends leaving that job."""
LOCKED_POLL_S = 0.01
LOCKED_LOOK = 100
"""Due jobs of each queue looked at for a held row when a claim found none."""
OUTCOMES = {Status.SUCCEEDED: "succeeded", Status.RETRYING: "retried",
            Status.SCHEDULED: "retried", Status.QUEUED: "retried", Status.DEAD: "dead",
            Status.CANCELLED: "cancelled"}


@dataclass
class Drained:
    """What `drain` ran: one dict per attempt (id, type, queue, attempt, outcome, error,
    result), in the order run, and the counts of its outcomes."""

    jobs: list[dict[str, Any]] = field(default_factory=list)

    def _count(self, outcome: str) -> int:
        return sum(1 for job in self.jobs if job["outcome"] == outcome)

    @property
    def succeeded(self) -> int:
        return self._count("succeeded")

    @property
    def retried(self) -> int:
        return self._count("retried")

    @property
    def snoozed(self) -> int:
        return self._count("snoozed")

    @property
    def dead(self) -> int:
        return self._count("dead")

    @property
    def cancelled(self) -> int:
        return self._count("cancelled")


def drain(conn_or_url: Any, *, queues: Sequence[str] | None = None, max_jobs: int | None = None,
          skip_backoff: bool = True, settings: Settings | None = None) -> Drained:
    """Run due jobs of `queues` (every queue if None) until none is due or `max_jobs` ran.

    `conn_or_url`: a database URL, the `taskline_db` fixture, a SQLAlchemy Engine, Connection
    or Session, or a psycopg Connection; drain opens connections of its own to the same
    database, so it sees what the caller committed. With `skip_backoff`, a failed attempt's
    retry is due at once; without it, drain leaves it for its backoff. A job scheduled for
    later is not due, nor is a job its handler snoozed (`taskline.Snooze(delay_s)`) until its
    delay passed.
    """
    url = database_url(conn_or_url)
    settings = settings or Settings.from_env(database_url=url)
    registry.load(settings.handlers)
    store = Store.connect(url, pool_size=2, schema=settings.schema)
    try:
        return Drainer(store, settings, queues, skip_backoff).run(max_jobs)
    finally:
        store.dispose()


class Drainer:
    """One drain: the claim, run and record of each due job in turn."""

    def __init__(self, store: Store, settings: Settings, queues: Sequence[str] | None,
                 skip_backoff: bool) -> None:
        self._store = store
        self._settings = settings
        self._queues = list(queues) if queues is not None else None
        self._skip_backoff = skip_backoff
        self._attempts = Attempts(1)
        self._recorder = Recorder(store=store, dispatcher=None, worker_id=WORKER_ID,
                                  settings=settings, attempts=self._attempts,
                                  types=TypeLabels(registry.registered_types()),
                                  forget=lambda _attempts: None)

    def run(self, max_jobs: int | None) -> Drained:
        drained = Drained()
        while max_jobs is None or len(drained.jobs) < max_jobs:
            claimed = self._claim_next()
            if claimed is None:
                break
            drained.jobs.append(self._run(*claimed))
        return drained

    def _claim_next(self) -> tuple[Claimed, float] | None:
        """The next due job, claimed as a worker dispatching from PostgreSQL claims it. That
        claim skips a row another transaction holds, which a worker finds on its next turn;
        a drain has none, so it waits for such a row (up to LOCKED_WAIT_S) before ending."""
        deadline = time.monotonic() + LOCKED_WAIT_S
        while True:
            claimed, queues = self._claim_once()
            if claimed is not None or not queues:
                return claimed
            if time.monotonic() >= deadline or not self._store.due_queued_locked(
                    queues, LOCKED_LOOK):
                return None
            time.sleep(LOCKED_POLL_S)

    def _claim_once(self) -> tuple[tuple[Claimed, float] | None, list[str]]:
        """One look: the next due job claimed (with when its claim was sent), if any, and the
        queues looked in."""
        if self._skip_backoff:
            self._store.skip_backoff()
        self._store.promote_due(PROMOTE_BATCH)
        queues = self._queues if self._queues is not None else sorted(
            self._store.pending_queues())
        if not queues:
            return None, queues
        sent_at = time.monotonic()
        claimed = self._store.claim_due_jobs(queues, 1, WORKER_ID, DRAIN_LEASE_S)
        if not claimed:
            claimed = self._store.claim_held(queues, 1, WORKER_ID, DRAIN_LEASE_S).claimed
        return ((claimed[0], sent_at) if claimed else None), queues

    def _run(self, claimed: Claimed, sent_at: float) -> dict[str, Any]:
        attempt = Attempt.begin(claimed, WORKER_ID, sent_at, DRAIN_LEASE_S,
                                self._settings.fence_margin_s, self._store.parent_results,
                                self._store.write_progress)
        self._attempts.add(attempt)
        started = time.monotonic()
        result: Any = None
        error: BaseException | None = None
        try:
            result = runner.call_handler(attempt)  # the worker pool's own call
        except Exception as err:
            error = err
        attempt.duration_s = time.monotonic() - started
        if attempt.duration_s > attempt.job.timeout_s:
            # A worker abandons a handler at its timeout; here it ran to its end, but its
            # outcome is the timeout's, as in production.
            attempt.settle(Settler.TIMEOUT)
            self._recorder.timed_out(attempt)
        else:
            attempt.settle(Settler.HANDLER)
            self._recorder.ended(attempt, result, error)
        self._recorder.record_reported()
        return self._ran(attempt, result, error)

    def _ran(self, attempt: Attempt, result: Any, error: BaseException | None) -> dict[str, Any]:
        job = self._store.get_job(attempt.job.id)
        status = job.status if job is not None else None
        outcome = OUTCOMES.get(status, "not recorded") if status is not None else "not recorded"
        if isinstance(error, Snooze) and status is Status.SCHEDULED:
            outcome = "snoozed"  # its attempt not counted; due again after its delay
        return {"id": attempt.job_id, "type": attempt.job.type, "queue": attempt.queue,
                "attempt": attempt.job.attempts, "outcome": outcome,
                "result": result if error is None else None,
                "error": None if error is None else f"{type(error).__name__}: {error}"}
