"""The worker loop: fetch ids from Redis, claim them in PostgreSQL, start their handlers.

Invariant: an id is taken from Redis only into this worker's processing list (atomically, most
urgent first, queues in the configured order) and is started only after PostgreSQL granted its
lease; an id not won is acked away. With nothing to fetch the loop blocks inside Redis on the
queues' signal lists, so an idle worker starts a new job milliseconds after its push. While
PostgreSQL is unreachable the loop takes nothing; once it answers again, ids fetched but never
claimed are put back (their priority comes from PostgreSQL). That sweep may push back an id
another loop thread fetched a moment before and is claiming: PostgreSQL still grants it to one
worker, and the copy left in Redis is acked away as a claim conflict. While Redis is
unreachable the loop claims straight from PostgreSQL instead (taskline_worker.degraded), with
the same claim, the same slots and the same start order.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from taskline import tracing
from taskline.dispatch.dispatcher import Dispatcher
from taskline.errors import DispatchUnavailable, StoreUnavailable
from taskline.execution.attempts import Attempts
from taskline.execution.fencing import Fence
from taskline.metrics import CLAIM_CONFLICTS, PAUSE_HELD, WAIT_TIME, CachedLabels, TypeLabels
from taskline.service import guarded
from taskline.settings import Settings
from taskline.store.store import Claimed
from taskline.store.views import WorkerStore
from taskline_worker.degraded import DispatchMode
from taskline_worker.handback import Handback
from taskline_worker.held import HeldWork
from taskline_worker.pace import Pace

log = logging.getLogger(__name__)

Fetched = list[tuple[str, str]]  # (queue, job id), in the order Redis gave them
Execute = Callable[[list[Claimed], float], None]
HandOff = Callable[[], None]

SLOT_WAIT_S = 1.0
SHORT_WAIT_S = 0.2
"""A held-work wait shorter than this is slept locally rather than blocked in Redis."""
ERROR_BACKOFF_S = (0.1, 5.0)
_WAIT_TIME = CachedLabels(WAIT_TIME)


class Turns:
    """Tickets served in order: holder n goes only after holders 0..n-1 are done."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._next_ticket = 0
        self._serving = 0
        self._done: set[int] = set()

    def take(self) -> int:
        with self._cond:
            ticket = self._next_ticket
            self._next_ticket += 1
            return ticket

    def wait(self, ticket: int) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._serving == ticket)

    def done(self, ticket: int) -> None:
        with self._cond:
            self._done.add(ticket)
            while self._serving in self._done:
                self._done.discard(self._serving)
                self._serving += 1
            self._cond.notify_all()


class FetchLoop:
    """fetch → claim → execute, until stopped; `run_once` is one turn.

    Several threads may run the same loop: while one waits for its claim's commit, another
    fetches and claims the next batch. Each takes only the slots it reserved.
    """

    def __init__(self, *, store: WorkerStore, dispatcher: Dispatcher, worker_id: str,
                 queues: Sequence[str], settings: Settings, batch: int, slots: Attempts,
                 fence: Fence, handback: Handback, types: TypeLabels, execute: Execute,
                 hand_off: HandOff, pace: Pace | None = None,
                 held: HeldWork | None = None, mode: DispatchMode | None = None) -> None:
        self._store = store
        self._dispatcher = dispatcher
        self._worker_id = worker_id
        self._queues = list(queues)
        self._lease_s = settings.lease_s
        self._batch = batch
        self._slots = slots
        self._fence = fence
        self._handback = handback
        self._types = types
        self._execute = execute
        self._hand_off = hand_off
        self._pace = pace
        self._held = held
        self._fetching = threading.Lock()
        self._turns = Turns()
        self._recovering = threading.Lock()
        self._mode = mode
        # Per thread: the waker generation of its last claim, and whether that claim was refused
        # ids (then the next one asks why in the same round trip).
        self._seen = threading.local()

    def run(self, stop: threading.Event) -> None:
        failures = 0
        drained = False
        while not stop.is_set():
            ok, result = guarded("fetch", lambda d=drained: self.run_once(stop, d))
            drained = bool(result)
            failures = 0 if ok else failures + 1
            if failures:
                low, cap = ERROR_BACKOFF_S
                stop.wait(min(low * 2 ** (failures - 1), cap))

    def run_once(self, stop: threading.Event, drained: bool = False) -> bool:
        """One turn; returns whether the queues were found drained (the next turn then waits).

        A turn after a drained one blocks in Redis until a push signals, and fetches in the
        same round trip. Waiting straight away is safe: every push after our fetch left a
        signal behind, so the wait returns at once.
        """
        if self._fence.tripped:
            self._recover(stop)
            return False
        reserved = self._slots.reserve(stop, SLOT_WAIT_S, self._batch)
        if reserved <= 0:
            return drained
        try:
            if self._mode is not None and self._mode.degraded:
                return self._postgres_turn(reserved, drained)
            with self._fetching:  # fetches, and so tickets, in Redis's order
                try:
                    fetched, drained = self._fetch_turn(reserved, drained)
                except DispatchUnavailable as err:
                    if self._mode is None:
                        raise
                    self._mode.lost(err)
                    return False
                ticket = self._turns.take()
            try:
                started = self._claim_and_start(fetched, ticket) if fetched else 0
            finally:
                self._turns.done(ticket)
            if self._held is not None and reserved > started and self._held.due():
                self._start_held(reserved - started)
            if fetched and drained:
                # The next turn blocks in Redis: let the woken handler threads start first.
                self._hand_off()
        finally:
            self._slots.unreserve(reserved)
        return drained

    def _fetch_turn(self, reserved: int, drained: bool) -> tuple[Fetched, bool]:
        """Up to `reserved` ids, blocking in Redis first after a drained turn; and whether the
        queues are drained now."""
        wait_s = None if self._held is None else self._held.wait_s(SLOT_WAIT_S)
        if drained and wait_s is not None and 0.0 < wait_s < SHORT_WAIT_S:
            if self._held is not None and self._held.timed():
                # Redis ends a blocked wait on its own clock tick (every 100 ms at the default
                # hz), so a wait shorter than that is slept here: a rate budget frees on time.
                time.sleep(wait_s)
                wait_s = 0.0
            else:
                # Only keyed jobs wait, and their look is a backstop: block in Redis, where the
                # next turn's push wakes the loop, rather than sleep deaf to it.
                wait_s = SHORT_WAIT_S
        if drained and wait_s != 0.0:
            first = self._queues[0]
            fetched = [(first, job_id) for job_id in self._dispatcher.wait_and_fetch(
                self._queues, self._worker_id, reserved, wait_s)]
            # That fetch saw the first queue only; the others are looked at next turn.
            return fetched, len(fetched) < reserved and len(self._queues) == 1
        fetched = self.fetch(reserved)
        return fetched, len(fetched) < reserved

    def _postgres_turn(self, reserved: int, drained: bool) -> bool:
        """A turn in postgres mode: after a drained turn, sleep until a notification (or the
        backstop), then claim up to `reserved` jobs PostgreSQL chooses and start them in
        order. The waker generation is read before the claim, so a notification sent while
        it runs ends the next sleep at once."""
        mode = self._mode
        assert mode is not None
        with self._fetching:
            if drained:
                mode.wait(getattr(self._seen, "generation", -1))
            self._seen.generation = mode.waker.generation
            ticket = self._turns.take()
        try:
            sent_at = time.monotonic()
            claimed = self.claim_due(reserved)
            self._turns.wait(ticket)
            self._execute(claimed, sent_at)
        finally:
            self._turns.done(ticket)
        # Limited and keyed jobs go through their budgeted claim, as on the Redis path; no
        # refusal tells of keyed ones here, so a turn with free slots looks for them.
        if self._held is not None and reserved > len(claimed):
            self._held.refused()
            if self._held.due():
                self._start_held(reserved - len(claimed))
        if claimed and len(claimed) < reserved:
            self._hand_off()
        return len(claimed) < reserved

    def _start_held(self, slots: int) -> None:
        """Claim held (limited or keyed) jobs within their budgets, and start them.

        Outside the turn: the budgeted claim is a transaction of several statements (with no
        flow limit, BEGIN, four reads and COMMIT took 18 s at a 2 s round trip, each statement
        prepared on first use), and the jobs the other fetch loop claims meanwhile must not
        wait for it to start: their leases run from their claim's send. PostgreSQL picks held
        jobs in its own order, so starting them apart loses no fetch order."""
        sent_at = time.monotonic()
        claimed = self._held.claim(slots) if self._held is not None else []
        if claimed:
            self._observe_wait(claimed)
            self._execute(claimed, sent_at)

    def _claim_and_start(self, fetched: Fetched, ticket: int) -> int:
        """Claim; then, once every earlier fetch has started its winners, start these.

        The claims of two fetch loops overlap, and either may commit first; starting in fetch
        order keeps a job fetched later (less urgent) from starting before one fetched earlier
        when jobs are claimed ahead of the handler threads.
        """
        sent_at = time.monotonic()
        claimed = self.claim(fetched)
        if self._pace is not None:
            self._pace.claimed(time.monotonic() - sent_at)
        self._turns.wait(ticket)
        self._execute(claimed, sent_at)
        return len(claimed)

    def _recover(self, stop: threading.Event) -> None:
        """One loop waits for PostgreSQL and sweeps; the others wait for it to finish."""
        if not self._recovering.acquire(blocking=False):
            stop.wait(SLOT_WAIT_S / 10)
            return
        try:
            if self._fence.tripped and self._fence.recover(stop):
                self._sweep()
        finally:
            self._recovering.release()

    def _sweep(self) -> None:
        try:
            self._handback.sweep()
        except DispatchUnavailable:
            if self._mode is None:
                raise
            self._mode.lost("sweep after PostgreSQL returned")  # the return sweeps instead

    def fetch(self, count: int) -> Fetched:
        """Up to `count` ids, queues in order, most urgent first inside each queue."""
        fetched: Fetched = []
        for queue in self._queues:
            if len(fetched) >= count:
                break
            try:
                ids = self._dispatcher.fetch(queue, self._worker_id, count - len(fetched))
            except DispatchUnavailable:
                if not fetched:
                    raise
                break  # claim what is already in our processing list
            fetched += [(queue, job_id) for job_id in ids]
        return fetched

    def claim(self, fetched: Fetched) -> list[Claimed]:
        """Claim in one round trip; returns the winners in fetch order, acks the rest."""
        started_ns = time.time_ns()
        try:
            won, refused = self._claim_jobs([job_id for _, job_id in fetched])
        except StoreUnavailable as err:
            self._fence.trip(f"claim failed: {err}")
            return []
        except Exception:
            self._fence.trip("claim failed")  # recovery sweeps the fetched ids back
            raise
        by_id = {str(c.job.id): c for c in won}
        winners, losers = [], []
        for queue, job_id in fetched:
            claimed = by_id.pop(job_id, None)
            if claimed is None:
                losers.append((queue, job_id))
            else:
                winners.append(claimed)
        self._seen.refusing = bool(losers)
        winners += self._drop(losers, refused)
        self._observe_wait(winners)
        ended_ns = time.time_ns()
        for claimed in winners:
            tracing.record("claim", claimed.job, self._worker_id, started_ns, ended_ns)
        return winners

    def _claim_jobs(self, ids: list[str]) -> tuple[list[Claimed], list | None]:
        """The plain claim; after a claim of this thread that was refused ids (keyed jobs,
        whose turns keep coming, or a pause), with the refusals in the same round trip."""
        if getattr(self._seen, "refusing", False):
            return self._store.claim_jobs_explained(ids, self._worker_id, self._lease_s)
        return self._store.claim_jobs(ids, self._worker_id, self._lease_s), None

    def claim_due(self, count: int) -> list[Claimed]:
        """Claim up to `count` jobs of our queues chosen by PostgreSQL, in claim order."""
        started_ns = time.time_ns()
        try:
            won = self._store.claim_due_jobs(self._queues, count, self._worker_id,
                                             self._lease_s)
        except StoreUnavailable as err:
            self._fence.trip(f"claim failed: {err}")
            return []
        except Exception:
            self._fence.trip("claim failed")
            raise
        self._observe_wait(won)
        ended_ns = time.time_ns()
        for claimed in won:
            tracing.record("claim", claimed.job, self._worker_id, started_ns, ended_ns)
        return won

    def _drop(self, losers: Fetched, refused: list | None = None) -> list[Claimed]:
        """Of the ids the plain claim refused: claim the keyed ones that are their key's head
        (returned, to start with the others); ack away the rest, lost to another claimer or
        left to the budgeted claim; hand back those a pause holds. `refused`: the claim's
        refusals when they came with it."""
        if not losers:
            return []
        losers, limited, keyed = self._held_back(losers, refused)
        for queue, _ in losers:
            CLAIM_CONFLICTS.labels(queue).inc()
        won = self._claim_keyed(keyed)
        if won is None:  # PostgreSQL unreachable: recovery sweeps the keyed ids back
            won, keyed = [], []
        started = {str(c.job.id) for c in won}
        # A keyed job behind its key's head leaves Redis: the turn passing pushes it again.
        losers += limited + [(q, j) for q, j in keyed if j not in started]
        if losers:
            try:
                self._dispatcher.ack(losers, self._worker_id)
            except DispatchUnavailable as err:
                log.warning("could not ack ids lost at claim; reconciliation removes them",
                            extra={"action": "claim_conflict", "error": str(err)})
        return won

    def _held_back(self, losers: Fetched,
                   explained: list | None = None) -> tuple[Fetched, Fetched, Fetched]:
        """Split the ids a claim refused: those of paused queues go back to their ready lists;
        returns (lost to another claimer, limited: left to the budgeted claim, keyed: jobs of
        an ordering key no flow limit applies to, claimed next under their keys' locks).

        Runs only when a claim took fewer ids than fetched, so the normal path pays nothing.
        The fetch script takes nothing from a queue whose pause marker is set, so paused ids
        come only around a pause or after Redis lost the marker; hold_back restores it briefly.
        """
        try:
            if explained is None:
                explained = self._store.claim_refusals([job_id for _, job_id in losers])
        except StoreUnavailable as err:
            self._fence.trip(f"claim check failed: {err}")  # recovery sweeps the ids back
            return [], [], []
        refused = {str(r.id): r for r in explained}
        paused = [(refused[j].queue, refused[j].priority, j) for _, j in losers
                  if j in refused and refused[j].paused]
        keyed = [(q, j) for q, j in losers if j in refused and not refused[j].paused
                 and refused[j].keyed]
        limited = [(q, j) for q, j in losers if j in refused and not refused[j].paused
                   and refused[j].limited and not refused[j].keyed]
        if paused:
            self._hand_back_paused(paused)
        if limited and self._held is not None:
            self._held.refused()
        held = {j for _, _, j in paused} | {j for _, j in limited} | {j for _, j in keyed}
        return [(q, j) for q, j in losers if j not in held], limited, keyed

    def _claim_keyed(self, keyed: Fetched) -> list[Claimed] | None:
        """Claim, under their keys' locks, the keyed ids that are their key's head now; None
        when PostgreSQL could not be reached (the fence is tripped)."""
        if not keyed:
            return []
        try:
            won = self._store.claim_keyed([j for _, j in keyed], self._worker_id,
                                          self._lease_s)
        except StoreUnavailable as err:
            self._fence.trip(f"keyed claim failed: {err}")
            return None
        if won and self._held is not None:
            self._held.keyed_started(str(c.job.id) for c in won)
        return won

    def _hand_back_paused(self, ordered: list[tuple[str, int, str]]) -> None:
        for queue, _, _ in ordered:
            PAUSE_HELD.labels(queue).inc()
        try:
            self._dispatcher.hold_back(ordered, self._worker_id)
        except DispatchUnavailable as err:
            log.warning("could not hand back ids of a paused queue; reconciliation does",
                        extra={"action": "pause_hold", "error": str(err)})

    def _observe_wait(self, winners: list[Claimed]) -> None:
        observe_wait(self._types, winners)


def observe_wait(types: TypeLabels, winners: list[Claimed]) -> None:
    """The queue wait of each job just claimed (the wait-time histogram)."""
    for claimed in winners:
        job = claimed.job
        # Both instants are PostgreSQL's: updated_at is the claim, next_run_at when it
        # became runnable (enqueue, delay or retry due time).
        if job.next_run_at is not None:
            waited = max((job.updated_at - job.next_run_at).total_seconds(), 0.0)
            _WAIT_TIME(types(job.type), job.queue).observe(waited)
