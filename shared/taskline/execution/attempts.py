"""Attempts a worker holds: one claimed job's lease, handler context and fate, and the set of them.

Invariant: exactly one party settles an attempt (the handler's return, its timeout, the
self-fence or the shutdown hand-back), and only that party decides what, if anything, is
recorded for it. An attempt stays in the held set, being renewed, until its outcome has been
written or given up. It occupies a slot from its claim until the handler's end (or timeout) is
reported, so the next job starts while the outcome waits for its batched write. Up to `ahead`
(taskline_worker.pace) of the slots may be claimed ahead of the `concurrency` handler threads:
those jobs wait, leased and renewed, for a thread, so a freed thread never waits for a claim's
commit. A workflow step that succeeds keeps its slot until its outcome is written, and hands
it to a step its success released and the same transaction claimed (taskline.execution.outcomes),
or gives it back then. While jobs are claimed ahead, a claim waits until `batch` slots are free
and the bound is `batch - 1` higher, so it starts as early as a claim of one job would but takes
several (one round trip and statement for several jobs). A worker therefore runs at most
`concurrency` handlers, holds at most `concurrency + ahead + batch - 1` claimed jobs (ids being
claimed count; at most twice `concurrency`) and at most `LEASE_CAP_FACTOR * concurrency`
leases; claiming stops at any bound.
"""

from __future__ import annotations

import enum
import functools
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from taskline.handlers.registry import JobContext
from taskline.jobs import Job
from taskline.store.store import Claimed

LEASE_CAP_FACTOR = 4
"""Held leases per slot. A full pipeline holds about four batches at once: one being claimed
by each fetch loop, one running, one being written; fewer stalls claiming behind the writes
(the measured drain at each factor is in docs/performance.md)."""


class Settler(enum.StrEnum):
    """Who settled an attempt, i.e. who owns its outcome."""

    HANDLER = "handler"  # the handler returned or raised: its result is recorded
    TIMEOUT = "timeout"  # the timeout passed first: recorded as a timeout
    FENCE = "fence"  # the local lease deadline passed: nothing may be recorded
    HANDBACK = "handback"  # shutdown gave the job back: released, attempt not counted


@dataclass(eq=False)
class Attempt:
    """One run of one job under one lease."""

    claimed: Claimed
    ctx: JobContext
    lease_deadline: float
    """Local monotonic instant after which the lease may have lapsed: no write after it."""
    lost: bool = False
    """A renewal found the lease no longer ours (reaped, or the job left `running`)."""
    fenced: bool = False
    """The lease lapsed locally without renewal: the outcome is never recorded."""
    cancel_requested: bool = False
    settled_by: Settler | None = None
    lease_check: Any = None
    """The pending deadline that self-fences this attempt (see fencing.Fence)."""
    duration_s: float | None = None
    """How long the handler ran, seconds, once it returned, raised or timed out."""
    _running: bool = False
    _written_off: bool = False
    in_slot: bool = True
    """Whether this attempt still counts against the handler slots (see Attempts)."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def begin(cls, claimed: Claimed, worker_id: str, sent_at: float, lease_s: float,
              margin_s: float,
              parent_results: Callable[[uuid.UUID], dict[str, Any]] | None = None,
              write_progress: Callable[[int, str, Any], bool] | None = None) -> Attempt:
        """An attempt for a job just claimed; `sent_at` is when the claim was sent (monotonic).
        `parent_results` reads a workflow step's parents' results (used by steps only);
        `write_progress(lease_id, worker_id, value)` writes a progress value under the lease."""
        job = claimed.job
        ctx = JobContext(job_id=job.id, attempt=job.attempts, queue=job.queue, type=job.type,
                         worker_id=worker_id,
                         payloads=job.coalesced if job.coalesced is not None else [job.payload])
        if job.workflow_id is not None:
            ctx.workflow_id, ctx.step = job.workflow_id, job.step
            if parent_results is not None:
                ctx.load_parent_results = functools.partial(parent_results, job.id)
        if write_progress is not None:
            ctx.write_progress = functools.partial(write_progress, claimed.lease_id, worker_id)
        attempt = cls(claimed=claimed, ctx=ctx, lease_deadline=sent_at + lease_s - margin_s)
        if job.cancel_requested:
            attempt.request_cancel()
        return attempt

    @property
    def job(self) -> Job:
        return self.claimed.job

    @property
    def lease_id(self) -> int:
        return self.claimed.lease_id

    @property
    def queue(self) -> str:
        return self.claimed.job.queue

    @functools.cached_property
    def job_id(self) -> str:
        return str(self.claimed.job.id)

    def settle(self, by: Settler) -> bool:
        """Take ownership of the outcome; True only for the first caller."""
        with self._lock:
            if self.settled_by is not None:
                return False
            self.settled_by = by
            return True

    @property
    def renewable(self) -> bool:
        """Whether the lease keeper should still extend this lease."""
        if self.lost or self.fenced:
            return False
        return self.settled_by in (None, Settler.HANDLER)

    def renewed(self, sent_at: float, lease_s: float, margin_s: float) -> None:
        """A renewal sent at `sent_at` (monotonic) succeeded: move the local deadline on."""
        self.lease_deadline = max(self.lease_deadline, sent_at + lease_s - margin_s)

    def lease_valid(self, now: float | None = None) -> bool:
        """Whether this worker may still write the attempt's outcome."""
        now = time.monotonic() if now is None else now
        return not self.fenced and now < self.lease_deadline

    def stop(self) -> None:
        """Ask the handler to stop (it sees `ctx.stopping`)."""
        self.ctx.request_stop()

    def request_cancel(self) -> None:
        self.cancel_requested = True
        self.stop()

    def begin_run(self) -> None:
        with self._lock:
            self._running = True

    def end_run(self) -> bool:
        """The handler returned; True when its thread had been written off meanwhile."""
        with self._lock:
            self._running = False
            return self._written_off

    def write_off(self) -> bool:
        """Abandon the thread running the handler; False when the handler already returned."""
        with self._lock:
            if not self._running:
                return False
            self._written_off = True
            return True

    def log_extra(self, action: str, **more: Any) -> dict[str, Any]:
        """The fields every job-path log record carries."""
        job = self.claimed.job
        extra = {"action": action, "job_id": str(job.id), "queue": job.queue,
                 "attempt": job.attempts, "worker": self.ctx.worker_id, "type": job.type}
        if self.duration_s is not None:
            extra["duration_s"] = round(self.duration_s, 6)
        return {**extra, **more}


class Attempts:
    """The attempts whose leases this worker holds, and the handler slots they occupy.

    `concurrency` bounds the attempts whose handler runs (busy slots); `lease_cap` bounds all
    held leases, including outcomes still waiting to be written, so a slow PostgreSQL makes the
    worker stop claiming instead of piling up leases.
    """

    def __init__(self, concurrency: int, ahead: Callable[[], int] = lambda: 0,
                 batch: Callable[[], int] = lambda: 1) -> None:
        self.concurrency = concurrency
        self.lease_cap = LEASE_CAP_FACTOR * concurrency
        self._ahead = ahead
        """How many jobs to hold claimed beyond the handler threads (taskline_worker.pace)."""
        self._batch = batch
        """The fewest slots a claim waits for (taskline_worker.pace). The slots are that many
        less one above `concurrency + ahead`: a claim starts when as few jobs are left as with
        claims of one job each, but takes several."""
        self._held: dict[int, Attempt] = {}
        self._busy = 0
        self._reserved = 0
        """Slots a fetch loop has taken for ids it is fetching and claiming right now."""
        self._cond = threading.Condition()

    def __len__(self) -> int:
        with self._cond:
            return len(self._held)

    @property
    def busy(self) -> int:
        """Slots taken by attempts whose handler has not ended yet (claimed ahead included)."""
        with self._cond:
            return self._busy

    @property
    def running(self) -> int:
        """Handler threads at work, at most `concurrency` (the busy-slots gauge)."""
        with self._cond:
            return min(self._busy, self.concurrency)

    @property
    def waiting(self) -> int:
        """Jobs claimed ahead that wait for a handler thread (the claimed-ahead gauge)."""
        with self._cond:
            return max(self._busy - self.concurrency, 0)

    def add(self, attempt: Attempt) -> None:
        self.add_many((attempt,))

    def add_many(self, attempts: Sequence[Attempt], freeing: Sequence[Attempt] = ()) -> None:
        """Hold `attempts`, each in a slot; the slots of `freeing` pass to them in the same
        step (a workflow step's slot to the steps its success released), so no fetch loop
        can take a slot in between."""
        with self._cond:
            for attempt in attempts:
                self._held[attempt.lease_id] = attempt
            self._busy += len(attempts)
            for attempt in freeing:
                self._release_slot(attempt)
            if freeing:
                self._cond.notify_all()

    def free_slot(self, attempt: Attempt) -> None:
        """The handler ended (or was abandoned): its slot takes new work (idempotent)."""
        with self._cond:
            self._release_slot(attempt)
            batch = self._least()
            if self._free(batch) >= batch:
                # Only then may a fetch loop go on: waking it per freed slot to find too few
                # would cost a thread switch per job.
                self._cond.notify_all()

    def discard(self, attempt: Attempt) -> None:
        """Stop holding `attempt` (idempotent) and wake whoever waits for a slot."""
        self.discard_many((attempt,))

    def discard_many(self, attempts: Iterable[Attempt]) -> None:
        """`discard` each of `attempts` under one acquisition of the lock."""
        with self._cond:
            for attempt in attempts:
                if self._held.get(attempt.lease_id) is attempt:
                    del self._held[attempt.lease_id]
                    self._release_slot(attempt)
            self._cond.notify_all()

    def _release_slot(self, attempt: Attempt) -> None:
        """Give back `attempt`'s slot once (the caller holds the lock and notifies)."""
        if attempt.in_slot:
            attempt.in_slot = False
            self._busy -= 1

    def holds(self, attempt: Attempt) -> bool:
        with self._cond:
            return self._held.get(attempt.lease_id) is attempt

    def snapshot(self) -> list[Attempt]:
        with self._cond:
            return list(self._held.values())

    def free_slots(self) -> int:
        """How many more jobs may be claimed now: free slots, within the lease cap."""
        with self._cond:
            return self._free()

    def _free(self, batch: int = 1) -> int:
        """Free slots within the lease cap, the slots raised by `batch - 1` (see `__init__`)."""
        taken = self._busy + self._reserved
        held = len(self._held) + self._reserved
        slots = self.concurrency + self._ahead() + batch - 1
        return max(min(slots - taken, self.lease_cap - held), 0)

    def wait_for_free_slot(self, stop: threading.Event, timeout: float) -> int:
        """Block until a claim's worth of slots is free (the batch, see `__init__`; after
        `timeout`, any) or `stop` is set (see `wake`); returns the slots a claim may take now."""
        batch = self._least()
        self._wait(lambda: self._free(batch) >= batch or stop.is_set(), timeout)
        return self._free(batch)

    def _least(self) -> int:
        return max(self._batch(), 1)

    def reserve(self, stop: threading.Event, timeout: float, most: int) -> int:
        """Wait like `wait_for_free_slot`, then take up to `most` free slots for one fetch.

        Concurrent fetch loops each claim only what they reserved, so together they never
        exceed the slots; the caller `unreserve`s the same number once its winners are added.
        """
        with self._cond:  # re-entrant: the wait and the taking see the same free slots
            free = self.wait_for_free_slot(stop, timeout)
            taken = 0 if stop.is_set() else min(free, most)
            self._reserved += taken
            return taken

    def unreserve(self, count: int) -> None:
        with self._cond:
            self._reserved -= count
            self._cond.notify_all()

    def wait_until_empty(self, timeout: float, force: threading.Event | None = None) -> bool:
        """Block until nothing is held, `force` is set or `timeout` passes; True when empty."""
        self._wait(lambda: not self._held or (force is not None and force.is_set()), timeout)
        return len(self) == 0

    def wake(self) -> None:
        """Re-check every waiter's condition (a stop or force flag changed)."""
        with self._cond:
            self._cond.notify_all()

    def _wait(self, predicate: Callable[[], bool], timeout: float) -> None:
        with self._cond:
            self._cond.wait_for(predicate, timeout=max(timeout, 0))
