"""The worker: wires the loop, runner, recorder, lease keeper, fence and heartbeat together and
runs the lifecycle from registration to graceful shutdown.

Invariant: every claimed attempt ends in exactly one of: its outcome recorded (fenced on its
lease), its outcome given up because the lease lapsed (the reaper re-runs it), or its job handed
back at shutdown (not counted as an attempt). One Store and one Dispatcher serve the whole
process; there is no per-job connection set-up.
"""

from __future__ import annotations

import enum
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from taskline import tracing
from taskline.dispatch.dispatcher import Dispatcher
from taskline.dispatch.keys import valid_queue_name
from taskline.errors import ConfigError
from taskline.execution.attempts import Attempt, Attempts, Settler
from taskline.execution.deadlines import Deadlines
from taskline.execution.fencing import Fence
from taskline.execution.leases import LeaseKeeper
from taskline.execution.outcomes import NextSteps, Recorder
from taskline.execution.runner import Runner
from taskline.handlers import registry, serving, webhook
from taskline.metrics import (
    ABANDONED_HANDLERS,
    BUSY_SLOTS,
    CLAIM_CONFLICTS,
    CLAIMED_AHEAD,
    EVENT_LOOP_LAG,
    LEASE_RENEWALS,
    LOOP_ERRORS,
    PLACEMENT_CHANGES,
    PROCESSING_TIME,
    STALE_COMPLETIONS,
    CachedLabels,
    TypeLabels,
)
from taskline.placement import Placement
from taskline.service import guarded
from taskline.settings import Settings
from taskline.store.store import Claimed, Store
from taskline_worker.degraded import DispatchMode
from taskline_worker.handback import Handback
from taskline_worker.heartbeat import Heartbeat
from taskline_worker.held import HeldWork
from taskline_worker.loop import FetchLoop, observe_wait
from taskline_worker.pace import Pace

log = logging.getLogger(__name__)

FETCH_LOOPS = 2
"""Threads running the fetch loop: one claims while the other waits for its commit."""
EXTRA_CONNECTIONS = FETCH_LOOPS + 3  # fetch loops, lease keeper, recorder, heartbeat
LOOPS = ("fetch", "recorder", "lease_keeper", "heartbeat", "deadlines", "placement")
"""The `loop` label values of taskline_loop_errors_total this process can report."""
THREAD_JOIN_S = 5.0
REDIS_TIMEOUT_S = 2.0
"""Longest wait for a Redis reply beyond a blocked wait's own timeout, seconds: a worker
notices a silent (blackholed) Redis within a block plus this, and claims from PostgreSQL."""
_PROCESSING_TIME = CachedLabels(PROCESSING_TIME)


class Exit(enum.StrEnum):
    """Why `Worker.run` returned."""

    STOPPED = "stopped"
    RECYCLE = "recycle"  # too many abandoned handler threads: start a fresh process


def new_worker_id() -> str:
    """`<hostname>-<pid>-<random hex>`: unique even when a pid is reused."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


def check_options(queues: Sequence[str], concurrency: int) -> None:
    if not queues:
        raise ConfigError("a worker needs at least one queue")
    bad = [q for q in queues if not valid_queue_name(q)]
    if bad:
        raise ConfigError(f"invalid queue names: {', '.join(map(repr, bad))}")
    if not 1 <= concurrency <= 1000:
        raise ConfigError("--concurrency must be 1..1000")


class Worker:
    """One worker process's engine; `run()` blocks until `stop()` (or a recycle) completes."""

    metrics_port: int | None = None
    """The port its /metrics is served on (None: off), recorded in `workers` at registration;
    set by `taskline worker` once the port is bound."""
    cpus: list[int] | None = None
    """The CPUs `taskline worker` pinned the process to (None: not pinned), recorded in
    `workers` at registration and again when its placement changes them."""
    placement: Placement | None = None
    """Watches an `auto`-pinned process's CPU from a thread of its own (set by `taskline
    worker`; None: not `auto`-pinned)."""

    def __init__(self, settings: Settings, queues: Sequence[str], concurrency: int, *,
                 block_timeout_s: float = 1.0) -> None:
        check_options(queues, concurrency)
        self.settings = settings
        self.queues = list(dict.fromkeys(queues))
        self.concurrency = concurrency
        self.worker_id = new_worker_id()
        self.types = TypeLabels(registry.load(settings.handlers))
        webhook.configure(settings)  # the built-in webhook handler's address allow-list
        self.store = Store.connect(settings.database_url, pool_size=concurrency + EXTRA_CONNECTIONS,
                                   schema=settings.schema, application_name="taskline-worker",
                                   transaction_pooled=settings.transaction_pooled,
                                   generic_plans=True)
        self.dispatcher = Dispatcher(settings.redis_url, block_timeout_s=block_timeout_s,
                                     timeout_s=REDIS_TIMEOUT_S, breaker=True,
                                     partitions=settings.queue_partitions)
        self.stopping = threading.Event()
        self.forced = threading.Event()
        self.started = threading.Event()
        self.recycle_requested = False
        self.registered = False
        self._background_stop = threading.Event()
        self._build()

    def _build(self) -> None:
        s = self.settings
        self.pace = Pace(self.concurrency)
        self.attempts = Attempts(self.concurrency, ahead=lambda: self.pace.ahead,
                                 batch=lambda: self.pace.batch)
        self.deadlines = Deadlines()
        self.fence = Fence(self.store, self.deadlines, self.attempts)
        self.handback = Handback(self.store, self.dispatcher, self.worker_id, self.queues)
        self.held = HeldWork(self.store, self.dispatcher, self.worker_id, self.queues, s.lease_s)
        self.recorder = Recorder(store=self.store, dispatcher=self.dispatcher,
                                 worker_id=self.worker_id, settings=s, attempts=self.attempts,
                                 types=self.types, forget=self.fence.forget_many,
                                 on_settled=self.held.ended,
                                 next_steps=NextSteps(self.queues, self._start_next,
                                                      lambda: not self.stopping.is_set()))
        self.runner = Runner(self.concurrency, self.deadlines, on_finished=self._finished,
                             on_timeout=self._timed_out, on_recycle=self._recycle)
        self.keeper = LeaseKeeper(store=self.store, worker_id=self.worker_id, settings=s,
                                  attempts=self.attempts, on_renewed=self.fence.watch)
        self.heartbeat = Heartbeat(store=self.store, dispatcher=self.dispatcher,
                                   worker_id=self.worker_id, period_s=s.heartbeat_s,
                                   attempts=self.attempts, runner=self.runner)
        self.mode = DispatchMode(store=self.store, dispatcher=self.dispatcher,
                                 database_url=s.session_url, worker_id=self.worker_id,
                                 queues=self.queues, on_return=self.handback.sweep,
                                 stop=self._background_stop)
        self.loop = FetchLoop(store=self.store, dispatcher=self.dispatcher,
                              worker_id=self.worker_id, queues=self.queues, settings=s,
                              batch=s.claim_batch or self.concurrency, slots=self.attempts,
                              fence=self.fence, handback=self.handback, types=self.types,
                              execute=self._execute, hand_off=self.runner.hand_off,
                              pace=self.pace, held=self.held, mode=self.mode)

    # --- lifecycle -----------------------------------------------------------------------

    def register(self) -> None:
        """The worker's first contact with PostgreSQL: its row in `workers`, and its
        connections opened. StoreUnavailable while PostgreSQL is unreachable; `taskline
        worker` retries it until PostgreSQL answers (taskline.startup)."""
        self._upsert_row()
        serving.record(self.store, self.worker_id, self.settings)  # types with payload schemas
        # One connection for each thread that talks to PostgreSQL by itself (and one for a
        # step's success written on its handler thread), opened now: opened on first use, its
        # set-up would delay that claim or renewal, by seconds on a slow link.
        self.store.open_connections(EXTRA_CONNECTIONS + 1)
        self.registered = True

    def run(self) -> Exit:
        """Register (unless done already), take work until stopped, then shut down
        gracefully."""
        try:
            if not self.registered:
                self.register()
        except Exception:
            self._close()
            raise
        self._export_zeroes()
        threads = self._start_threads()
        log.info("worker started", extra={"action": "start", "worker": self.worker_id,
                                          "queues": self.queues, "concurrency": self.concurrency})
        self.started.set()
        fetchers = [threading.Thread(target=self.loop.run, args=(self.stopping,), daemon=True,
                                     name=f"taskline-fetch-{n}") for n in range(1, FETCH_LOOPS)]
        try:
            for fetcher in fetchers:
                fetcher.start()
            self.loop.run(self.stopping)
        finally:
            self.stop()  # the other fetch loops end too, even when this one raised
            for fetcher in fetchers:
                fetcher.join()
            self._shutdown(threads)
        return Exit.RECYCLE if self.recycle_requested else Exit.STOPPED

    def _export_zeroes(self) -> None:
        """Rare events start at 0, so a dashboard shows 0 rather than "no data" for them."""
        for loop in LOOPS:
            LOOP_ERRORS.labels(loop)
        for result in ("ok", "lost", "error"):
            LEASE_RENEWALS.labels(result)
        for queue in self.queues:
            CLAIM_CONFLICTS.labels(queue)
            STALE_COMPLETIONS.labels(queue)

    def stop(self, force: bool = False) -> None:
        """Stop taking work; with `force`, hand running jobs back without waiting the grace."""
        self.stopping.set()
        if force:
            self.forced.set()
        self.attempts.wake()
        self.mode.waker.poke()

    def _start_threads(self) -> list[threading.Thread]:
        self.runner.start()
        bg = self._background_stop
        targets: list[tuple[str, Callable[[], Any]]] = [
            ("deadlines", lambda: self.deadlines.run(bg)),
            ("recorder", self.recorder.run),
            ("lease-keeper", lambda: self.keeper.run(bg)),
            ("heartbeat", lambda: self.heartbeat.run(bg)),
        ]
        if self.placement is not None:
            placement = self.placement
            targets.append(("placement", lambda: placement.run(bg)))
        threads = [threading.Thread(target=fn, name=f"taskline-{name}", daemon=True)
                   for name, fn in targets]
        for thread in threads:
            thread.start()
        return threads

    def _shutdown(self, threads: list[threading.Thread]) -> None:
        running = len(self.attempts)
        log.info("worker stopping", extra={"action": "stop", "worker": self.worker_id,
                                           "running": running,
                                           "grace_s": self.settings.shutdown_grace_s})
        self.attempts.wait_until_empty(self.settings.shutdown_grace_s, self.forced)
        self._hand_back()
        # Outcomes already reported are still being written (renewed meanwhile); the wait is
        # bounded because the recorder gives up once a lease lapses.
        self.attempts.wait_until_empty(self.settings.lease_s + 1)
        self._background_stop.set()
        self.mode.close()
        self.recorder.stop()
        self.deadlines.wake()
        self.keeper.wake()
        self.runner.stop()
        for thread in threads:
            thread.join(THREAD_JOIN_S)
        self._best_effort("sweep", self.handback.sweep)
        self._best_effort("deregister", self._deregister)
        self._close()
        log.info("worker stopped", extra={"action": "stopped", "worker": self.worker_id})

    def _hand_back(self) -> None:
        remaining = []
        for attempt in self.attempts.snapshot():
            if attempt.settle(Settler.HANDBACK):
                attempt.stop()
                remaining.append(attempt)
            elif attempt.settled_by is Settler.FENCE:
                self.attempts.discard(attempt)
        if not remaining:
            return
        log.warning("grace period over: handing running jobs back",
                    extra={"action": "handback", "worker": self.worker_id,
                           "jobs": len(remaining)})
        try:
            self._best_effort("hand back", lambda: self.handback.release(remaining))
        finally:
            for attempt in remaining:
                self.fence.forget(attempt)
                self.attempts.discard(attempt)

    def _close(self) -> None:
        self.store.dispose()
        self.dispatcher.close()

    def _deregister(self) -> None:
        for gauge in (BUSY_SLOTS, CLAIMED_AHEAD, EVENT_LOOP_LAG, ABANDONED_HANDLERS):
            gauge.labels(self.worker_id).set(0)
        try:
            self.store.stop_worker(self.worker_id)
        finally:
            self.dispatcher.forget_worker(self.worker_id)

    def _best_effort(self, what: str, fn: Callable[[], object]) -> None:
        try:
            fn()
        except Exception as err:
            log.warning(f"shutdown step failed: {what}",
                        extra={"action": "stop", "worker": self.worker_id,
                               "error": f"{type(err).__name__}: {err}"})

    def placed(self, cpus: list[int] | None, change: str) -> None:
        """The placement pinned, freed or moved this process (`cpus` None: not
        pinned now): counted, and recorded in its row of `workers` for `GET /api/v1/workers`
        and the dashboard."""
        self.cpus = cpus
        PLACEMENT_CHANGES.labels(change).inc()
        guarded("placement", self._upsert_row, "workers table")

    def _upsert_row(self) -> None:
        self.store.upsert_worker(self.worker_id, socket.gethostname(), os.getpid(),
                                 self.queues, self.concurrency, self.metrics_port, self.cpus)

    def _recycle(self) -> None:
        log.warning("too many abandoned handler threads: recycling the worker process",
                    extra={"action": "recycle", "worker": self.worker_id,
                           "abandoned_threads": self.runner.abandoned})
        self.recycle_requested = True
        self.stop()

    # --- per attempt ---------------------------------------------------------------------

    def _execute(self, claimed: list[Claimed], sent_at: float,
                 freeing: Sequence[Attempt] = ()) -> None:
        """Start the claimed jobs' handlers, in fetch order; they take the slots of
        `freeing` (workflow steps whose success released and claimed them)."""
        s = self.settings
        attempts = [Attempt.begin(c, self.worker_id, sent_at, s.lease_s, s.fence_margin_s,
                                  self.store.parent_results, self.store.write_progress)
                    for c in claimed]
        if log.isEnabledFor(logging.INFO):  # spares building the fields per job
            for attempt in attempts:
                log.info("job claimed", extra=attempt.log_extra("claimed"))
        # Held and watched before any starts; one lock acquisition each for the whole batch.
        self.attempts.add_many(attempts, freeing)
        self.fence.watch_many(attempts)
        self.keeper.started(attempts)
        self.runner.submit_many(attempts)

    def _start_next(self, claimed: list[Claimed], sent_at: float,
                    freeing: Sequence[Attempt]) -> None:
        """Start workflow steps claimed by the transaction that recorded their parents'
        success, or keyed jobs whose turn it passed, in those parents' (heads') slots."""
        # A keyed job's end makes the budgeted claim look for a job its settle could not see.
        self.held.keyed_started(str(c.job.id) for c in claimed if c.job.ordering_key is not None)
        ended_ns = time.time_ns()
        observe_wait(self.types, claimed)
        for c in claimed:
            tracing.record("claim", c.job, self.worker_id, ended_ns, ended_ns)
        self._execute(claimed, sent_at, freeing)
        # The recorder's bookkeeping can wait: let the woken handler threads start first (a
        # no-op on a pool thread, which runs the first claim itself).
        self.runner.hand_off()

    def _finished(self, attempt: Attempt, result: Any, error: BaseException | None,
                  seconds: float) -> None:
        """The handler returned or raised (on its own thread)."""
        if attempt.settle(Settler.HANDLER):
            attempt.duration_s = seconds
            self.pace.finished(seconds)
            _PROCESSING_TIME(self.types(attempt.job.type), attempt.queue).observe(seconds)
            self.recorder.ended(attempt, result, error)
            # The outcome waits for its (batched) write holding only the lease, not the slot;
            # a succeeded workflow step keeps its slot for the step its success may release,
            # and a succeeded keyed job for its key's next job (the turn it passes).
            if error is not None or (attempt.job.workflow_id is None
                                     and attempt.job.ordering_key is None):
                self.attempts.free_slot(attempt)
        elif attempt.settled_by is Settler.FENCE:
            self._discard(attempt)

    def _timed_out(self, attempt: Attempt) -> None:
        """The handler ran past its timeout and its thread was abandoned (deadline thread)."""
        attempt.stop()
        if attempt.settle(Settler.TIMEOUT):
            timeout_s = attempt.job.timeout_s
            attempt.duration_s = timeout_s
            PROCESSING_TIME.labels(self.types(attempt.job.type), attempt.queue).observe(timeout_s)
            self.recorder.timed_out(attempt)
            # The runner has already replaced the abandoned thread.
            self.attempts.free_slot(attempt)
        elif attempt.settled_by is Settler.FENCE:
            self._discard(attempt)

    def _discard(self, attempt: Attempt) -> None:
        self.fence.forget(attempt)
        self.attempts.discard(attempt)
