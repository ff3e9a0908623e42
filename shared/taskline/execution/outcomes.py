"""Outcomes: records how each attempt ended, fenced on its lease, then moves its id in Redis.

Invariant: PostgreSQL is written first and decides; Redis follows. Every write names the lease,
so a zero-row answer means the attempt was no longer ours (a zombie): nothing changes, the
outcome is counted as stale and the id only acked. Successes are grouped for a few milliseconds
and written with one statement and one pipelined ack. A write that fails because PostgreSQL is
unreachable is retried while the lease is still valid, then given up: the job runs again (at
least once, never lost). A Redis failure after the PostgreSQL write is logged; reconciliation
repairs Redis.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import tenacity

from taskline import tracing, transitions
from taskline.dispatch.dispatcher import Dispatcher
from taskline.errors import NonRetryableError, Snooze, StoreUnavailable
from taskline.execution.attempts import Attempt, Attempts
from taskline.execution.eventloop import on_event_loop
from taskline.execution.runner import BadResult, NoHandler
from taskline.jobs import Backoff, Outcome
from taskline.metrics import (
    JOB_CANCELLED,
    JOB_COMPLETED,
    JOB_DLQ,
    JOB_FAILED,
    JOB_RETRIED,
    JOB_SNOOZED,
    ORDERING_TURNS,
    STALE_COMPLETIONS,
    STEPS_RELEASED,
    STEPS_STARTED_IN_PLACE,
    STEPS_UNMET,
    CachedLabels,
    TypeLabels,
)
from taskline.mirror import Mirror
from taskline.service import guarded
from taskline.settings import Settings
from taskline.store.rows import Settled, Settlement, turns_passed
from taskline.store.store import Claimed, Store
from taskline.transitions import Committed, Transition

log = logging.getLogger(__name__)

SUCCESS, FAILURE, CANCEL = "success", "failure", "cancel"
BATCH_WINDOW_S = 0.002
# A batch is at most this many outcomes per statement: above a claim batch, so a busy worker's
# writes keep pace with two fetch loops, and one statement stays short (docs/performance.md).
BATCH_MAX = 250
ERROR_MAX = 2000
TRACEBACK_MAX = 8000
CANCELLED_ERROR = "cancelled while running"
RETRY_FIRST_WAIT_S = 0.05
"""How long the recorder waits after a write PostgreSQL could not take before its next try;
each later wait doubles, up to a second, while a lease of the batch is valid."""
_JOB_COMPLETED = CachedLabels(JOB_COMPLETED)


@dataclass(frozen=True, eq=False)
class Report:
    """How one attempt ended, waiting to be recorded (compared by identity)."""

    attempt: Attempt
    kind: str
    result: Any = None
    error: BaseException | None = None
    outcome: Outcome = Outcome.FAILED
    reported_ns: int = field(default_factory=time.time_ns)
    """When the attempt ended (time.time_ns()): the start of its `complete` span."""


def printable(text: str) -> str:
    """`text` without what PostgreSQL's text and jsonb refuse (NUL, lone surrogates)."""
    text = text.replace("\x00", "\\x00")
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_text(err: BaseException) -> str:
    """`Type: message`, storable and truncated: the job's last_error."""
    try:
        message = str(err)
    except Exception:
        message = "<unprintable message>"
    text = f"{type(err).__name__}: {message}" if message else type(err).__name__
    return printable(text)[:ERROR_MAX]


def error_detail(err: BaseException) -> dict[str, Any]:
    """The event detail of a failed attempt: the error and the traceback's tail (the
    transition adds its outcome, reason and delay)."""
    trace = printable("".join(traceback.format_exception(err)))
    return {"error": error_text(err), "traceback": trace[-TRACEBACK_MAX:]}


def failure_reason(err: BaseException, outcome: Outcome) -> str:
    """The bounded `reason` label of job_failed_total."""
    if outcome is Outcome.TIMEOUT:
        return "timeout"
    if isinstance(err, NoHandler):
        return "no_handler"
    if isinstance(err, BadResult):
        return "bad_result"
    if isinstance(err, NonRetryableError):
        return "non_retryable"
    return "error"


def _batchable(report: Report) -> bool:
    """Plain successes share one statement; hooks need a transaction of their own."""
    return report.kind == SUCCESS and not report.attempt.ctx.completion_hooks


def _releases(report: Report) -> bool:
    """A workflow step's success: its waiting dependents are released by its completion."""
    return report.kind == SUCCESS and report.attempt.job.workflow_id is not None


def _passes_turn(report: Report) -> bool:
    """A keyed job's success: its key's next job may start in its slot (settle_turning)."""
    return report.kind == SUCCESS and report.attempt.job.ordering_key is not None


def _holding_slots(reports: Iterable[Report]) -> list[Attempt]:
    """The succeeded workflow steps and keyed jobs still holding their slot (see
    Worker._finished)."""
    return [r.attempt for r in reports
            if (_releases(r) or _passes_turn(r)) and r.attempt.in_slot]


def newest_recorded(live: list[Report], done: set[str]) -> list[Report]:
    """The reports whose success was written, given the job ids the statement changed.

    A zombie attempt and the job's current attempt can share a batch; only the newest attempt
    can have been the running one, so the older report is the stale one.
    """
    newest: dict[str, Report] = {}
    for report in live:
        job_id = report.attempt.job_id
        if job_id in done and (job_id not in newest or report.attempt.job.attempts
                               > newest[job_id].attempt.job.attempts):
            newest[job_id] = report
    return list(newest.values())


def released_steps(rows: Iterable[Settled], started: int = 0) -> list[Committed]:
    """What the settlement made ready, to push after the commit: the waiting workflow steps it
    queued (`started` more were released and claimed on this worker by the same statement),
    and the ordering keys' next heads it gave the turn to."""
    rows = list(rows)
    released = [step for row in rows for step in row.released]
    if released or started:
        STEPS_RELEASED.inc(len(released) + started)
    unmet = sum(row.unmet for row in rows)
    if unmet:
        STEPS_UNMET.inc(unmet)
    turns = turns_passed(rows)
    if turns:
        ORDERING_TURNS.inc(len(turns))
    return [step.committed() for step in released] + turns


@dataclass(frozen=True)
class NextSteps:
    """How a worker starts, at once, the workflow steps its successes release: the queues it
    serves (in order), `start(claimed, sent_at, freeing)` to run claims in the slots of the
    attempts `freeing`, and `accepting()`, false once it stops taking work."""

    queues: Sequence[str]
    start: Callable[[list[Claimed], float, Sequence[Attempt]], None]
    accepting: Callable[[], bool] = lambda: True


@dataclass
class Written:
    """Successes whose write is done (or given up), waiting for the recorder thread to do the
    rest: Redis, metrics, logs and letting go of the attempts. `live` were written while
    their lease was valid; `rows` and `claimed` are the statement's answer."""

    reports: list[Report]
    live: list[Report] = field(default_factory=list)
    rows: list[Settled] = field(default_factory=list)
    claimed: list[Claimed] = field(default_factory=list)
    turned: bool = False
    """`claimed` are keyed turns started in place (settle_turning), not workflow steps."""
    failed: bool = False
    """The write raised (logged): only letting go of the attempts is left; their leases lapse
    and the reaper runs the jobs again."""


class Recorder:
    """Writes reported outcomes from its own thread (`run`), in batches where that helps.

    A workflow step's success is written on its own handler thread instead, when neither the
    recorder thread nor another handler thread is writing outcomes (`success`): the steps it
    releases then start on that thread without waking two others (the recorder, then a pool
    thread), and the recorder thread does the rest of its bookkeeping while they run.
    Simultaneous ones (a fan-out finishing) still go to the recorder, to share its statements.
    """

    def __init__(self, *, store: Store, dispatcher: Dispatcher | None, worker_id: str,
                 settings: Settings, attempts: Attempts, types: TypeLabels,
                 forget: Callable[[Iterable[Attempt]], None],
                 on_settled: Callable[[list[Committed]], None] | None = None,
                 next_steps: NextSteps | None = None) -> None:
        self._store = store
        self._next_steps = next_steps
        self._lease_s = settings.lease_s
        self._on_settled = on_settled
        self._dispatcher = dispatcher
        self._mirror = None if dispatcher is None else Mirror.of(dispatcher, store)
        self._worker_id = worker_id
        self._attempts = attempts
        self._types = types
        self._forget = forget
        self._backoff = Backoff(settings.backoff_base_s, settings.backoff_factor,
                                settings.backoff_max_s)
        self._max_snoozes = settings.max_snoozes
        self._queue: queue.SimpleQueue[Report | Written | None] = queue.SimpleQueue()
        self._here = threading.Lock()
        """Held by the handler thread writing a step's success itself (at most one at once)."""
        self._writing = False
        """The recorder thread is writing reported outcomes: a step's success waits to join
        its next batch instead of contending with it for the same children's rows."""

    # --- reporting (any thread) ----------------------------------------------------------

    def success(self, attempt: Attempt, result: Any) -> None:
        report = Report(attempt, SUCCESS, result=result, outcome=Outcome.SUCCEEDED)
        # Never written on an event loop's thread: the write would stall every coroutine.
        if self._next_steps is None or not _releases(report) or not _batchable(report) \
                or self._writing or on_event_loop() or not self._here.acquire(blocking=False):
            self._queue.put(report)
            return
        try:
            written = Written([report])
            written.failed = not guarded("recorder", lambda: self._write(written))[0]
        finally:
            self._here.release()
        self._queue.put(written)

    def ended(self, attempt: Attempt, result: Any, error: BaseException | None) -> None:
        """The handler of `attempt` (settled by its handler) returned `result` or raised
        `error`: report its outcome."""
        if error is None:
            # A handler that finishes its work despite a cancel request succeeded.
            self.success(attempt, result)
        elif attempt.cancel_requested:
            self.cancelled(attempt)
        else:
            self.failure(attempt, error, Outcome.FAILED)

    def timed_out(self, attempt: Attempt) -> None:
        """The handler of `attempt` (settled by its timeout) ran past its timeout."""
        if attempt.cancel_requested:
            self.cancelled(attempt)
        else:
            error = TimeoutError(f"handler ran past its timeout of {attempt.job.timeout_s:g} s")
            self.failure(attempt, error, Outcome.TIMEOUT)

    def failure(self, attempt: Attempt, error: BaseException, outcome: Outcome) -> None:
        self._queue.put(Report(attempt, FAILURE, error=error, outcome=outcome))

    def cancelled(self, attempt: Attempt) -> None:
        self._queue.put(Report(attempt, CANCEL, outcome=Outcome.CANCELLED))

    def stop(self) -> None:
        """Record what was reported so far, then end `run`."""
        self._queue.put(None)

    def record_reported(self) -> None:
        """Record, on this thread, what was reported so far (for a caller without a recorder
        thread: `taskline.testing.drain`), through the same batches as `run`."""
        batch, _more = self._ready([])
        if batch:
            self._record(batch)

    # --- the recorder thread -------------------------------------------------------------

    def run(self) -> None:
        more = True
        while more:
            batch, more = self._collect()
            if batch:
                self._record(batch)

    def _collect(self) -> tuple[list[Report | Written], bool]:
        """The next batch: wait for one report, then gather for a few ms; False after stop.

        A workflow step's success is not held back: its dependents wait for it, so the batch
        takes only what is reported already (a fan-out's burst still shares one statement).
        """
        first = self._queue.get()
        if first is None:
            return [], False
        batch: list[Report | Written] = [first]
        if not (isinstance(first, Written) or _releases(first)):
            # The window is slept out, not waited on the queue: a waiting thread is woken by
            # every report put, a sleeping one once per batch, and the batch is the same.
            time.sleep(BATCH_WINDOW_S)
        return self._ready(batch)

    def _ready(self, batch: list[Report | Written]) -> tuple[list[Report | Written], bool]:
        """`batch` and the reports queued already, at most BATCH_MAX, without waiting for
        more; False once the stop is taken."""
        while len(batch) < BATCH_MAX:
            try:
                report = self._queue.get_nowait()
            except queue.Empty:
                break
            if report is None:
                return batch, False
            batch.append(report)
        return batch, True

    def _record(self, batch: list[Report | Written]) -> None:
        written = [w for w in batch if isinstance(w, Written)]
        reports = [r for r in batch if isinstance(r, Report)]
        plain = [r for r in reports if _batchable(r)]
        others = [r for r in reports if not _batchable(r)]
        steps: list[tuple[Callable[[Any], None], Any]] = [
            (self._settled, w) for w in written if not w.failed]
        steps += [(self._complete, plain)] if plain else []
        steps += [(self._record_one, r) for r in others]
        self._writing = bool(reports)
        try:
            for step, arg in steps:
                # A step that fails leaves its leases to lapse, and the reaper re-runs those
                # jobs: late, but never lost.
                guarded("recorder", lambda step=step, arg=arg: step(arg))
        finally:
            self._writing = False
        attempts = [r.attempt for w in written for r in w.reports]
        attempts += [report.attempt for report in reports]
        self._forget(attempts)
        self._attempts.discard_many(attempts)

    def _record_one(self, report: Report) -> None:
        if report.kind == SUCCESS:
            self._complete_with_hooks(report)
        elif report.kind == CANCEL:
            self._cancel(report)
        else:
            self._fail(report)

    def _persist(self, reports: Sequence[Report],
                 write: Callable[[list[Report]], Any]) -> tuple[list[Report], Any] | None:
        """`write` the reports whose lease is valid, retrying while PostgreSQL is unreachable
        and some lease is still valid; returns (written reports, answer), None if none was.

        The first try runs outside tenacity: nearly every write succeeds at once, and a retry
        loop's state set up for every batch was a measurable share of the recorder's Python
        (docs/performance.md, change 137)."""
        def lapsed(_state: object = None) -> bool:
            return not any(r.attempt.lease_valid() for r in reports)

        try:
            return self._write_live(reports, write)
        except StoreUnavailable:
            if lapsed():  # as the loop's own stop would: no wait for a batch nobody may write
                return None
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(StoreUnavailable),
            before=_wait_first,
            wait=tenacity.wait_exponential(multiplier=2 * RETRY_FIRST_WAIT_S, max=1.0),
            stop=lapsed, reraise=True)
        try:
            for try_ in retrying:
                with try_:
                    return self._write_live(reports, write)
        except StoreUnavailable:
            return None
        return None

    def _write_live(self, reports: Sequence[Report],
                    write: Callable[[list[Report]], Any]) -> tuple[list[Report], Any] | None:
        """One try of `_persist`."""
        live = [r for r in reports if r.attempt.lease_valid()]
        if not live:
            return None
        answer = write(live)
        # PostgreSQL has decided these attempts: their lease deadline guards nothing now,
        # so a slow Redis step after this cannot self-fence them.
        self._forget([report.attempt for report in live])
        return live, answer

    def _settlement(self, report: Report, transition: Transition) -> Settlement:
        return Settlement(report.attempt.lease_id, self._worker_id, transition,
                          releases=report.attempt.job.workflow_id is not None)

    def _complete(self, reports: list[Report]) -> None:
        written = Written(reports)
        self._write(written)
        self._settled(written)

    def _write(self, written: Written) -> None:
        """Write these successes, then start at once the steps the write claimed."""
        answer = self._persist(written.reports, self._write_successes)
        if answer is None:
            return
        written.live, (written.rows, written.claimed, sent_at) = answer
        written.turned = not any(_releases(r) for r in written.live)
        # Released steps go first, before any bookkeeping: they wait for nothing else.
        if written.claimed and self._next_steps is not None:
            started = ORDERING_TURNS if written.turned else STEPS_STARTED_IN_PLACE
            started.inc(len(written.claimed))
            self._next_steps.start(written.claimed, sent_at,
                                   _holding_slots(written.live)[:len(written.claimed)])

    def _settled(self, written: Written) -> None:
        """What follows a write of successes: Redis, metrics and logs."""
        reports, live, rows, claimed = written.reports, written.live, written.rows, \
            written.claimed
        self._follow(released_steps(rows, 0 if written.turned else len(claimed)), [])
        self._gave_up([r for r in reports if r not in live])
        recorded = set(newest_recorded(live, {str(row.id) for row in rows}))
        stale = [r for r in live if r not in recorded]
        for report in recorded:
            self._completed(report)
        for report in stale:
            self._stale(report)
        self._follow([self._committed(r, transitions.SUCCEED) for r in recorded], stale)

    def _write_successes(self, live: list[Report]) -> tuple[list[Settled], list[Claimed], float]:
        """Settle these successes; steps they release that can start here at once are claimed
        in the same transaction, one per slot a succeeded step holds. Returns the settled rows,
        those claims and when the claim was sent (monotonic)."""
        if not any(_releases(r) or _passes_turn(r) for r in live):
            # The common batch: plain jobs, one lean statement (Store.settle_succeeded).
            return self._store.settle_succeeded(
                [(r.attempt.lease_id, r.result) for r in live], self._worker_id), [], 0.0
        holding, steps = _holding_slots(live), self._next_steps
        settlements = [self._settlement(r, transitions.succeeded(r.result)) for r in live]
        if not holding or steps is None or not steps.accepting():
            return self._store.settle(settlements), [], 0.0
        sent_at = time.monotonic()
        # Steps released, or else keyed turns passed, start in the slots held for them; a
        # batch with both starts the steps, and its turns go through Redis as usual.
        continuing = self._store.settle_continuing if any(_releases(r) for r in live) \
            else self._store.settle_turning
        rows, claimed = continuing(settlements, worker_id=self._worker_id,
                                   lease_s=self._lease_s, queues=steps.queues,
                                   most=len(holding))
        return rows, claimed, sent_at

    def _complete_with_hooks(self, report: Report) -> None:
        attempt = report.attempt
        settlement = self._settlement(report, transitions.succeeded(report.result))
        try:
            written = self._persist([report], lambda _live: self._store.settle_with_hooks(
                settlement, attempt.ctx.completion_hooks))
        except Exception as err:  # a hook failed: the completion rolled back with it
            self._fail(replace(report, kind=FAILURE, error=err, outcome=Outcome.FAILED))
            return
        if written is None:
            self._gave_up([report])
        elif written[1]:
            self._follow(released_steps(written[1]), [])
            self._completed(report)
            self._follow([self._committed(report, transitions.SUCCEED)], [])
        else:
            self._stale(report)
            self._follow([], [report])

    def _cancel(self, report: Report) -> None:
        attempt = report.attempt
        transition = transitions.cancelled_while_running(CANCELLED_ERROR)
        row = self._settle_one(report, transition)
        if row is None:
            return
        JOB_CANCELLED.labels(attempt.queue).inc()
        log.info("job cancelled while running", extra=attempt.log_extra("cancelled"))
        self._traced(report, "cancelled")
        self._follow(released_steps([row]), [])  # `when` dependents it decided
        self._follow([row.committed(transition.move)], [])

    def _snooze(self, report: Report, err: Snooze) -> None:
        attempt = report.attempt
        transition = transitions.decide_snooze(attempt.job.snoozes, self._max_snoozes,
                                               err.delay_s)
        if transition.move is not transitions.SNOOZE:
            self._fail(replace(report, error=NonRetryableError(transition.error)))
            return
        row = self._settle_one(report, transition)
        if row is None:
            return
        JOB_SNOOZED.labels(self._types(attempt.job.type), attempt.queue).inc()
        log.info("job snoozed", extra=attempt.log_extra("snoozed", delay_s=err.delay_s))
        self._traced(report, transition.event.value)
        self._follow([row.committed(transition.move)], [])

    def _fail(self, report: Report) -> None:
        attempt, err = report.attempt, report.error
        assert err is not None
        if isinstance(err, Snooze):
            self._snooze(report, err)
            return
        job = attempt.job
        text = error_text(err)
        transition = transitions.decide_retry(
            job.attempts, job.max_retries, self._backoff, text, outcome=report.outcome,
            retryable=not isinstance(err, NonRetryableError),
            delay_override_s=getattr(err, "delay_s", None), detail=error_detail(err))
        row = self._settle_one(report, transition)
        if row is None:
            return
        JOB_FAILED.labels(self._types(job.type), job.queue, failure_reason(err, report.outcome)
                          ).inc()
        if transition.move is transitions.RETRY:
            JOB_RETRIED.labels(self._types(job.type), attempt.queue).inc()
            log.warning("attempt failed, retry scheduled", extra=attempt.log_extra(
                "retry_scheduled", error=text, delay_s=round(transition.delay_s or 0.0, 3),
                outcome=report.outcome.value))
        else:
            JOB_DLQ.labels(self._types(job.type), attempt.queue).inc()
            log.error("job dead-lettered", extra=attempt.log_extra(
                "dead_lettered", error=text, reason=transition.reason,
                outcome=report.outcome.value))
        self._traced(report, transition.event.value, text)
        self._follow(released_steps([row]), [])  # `when` dependents a death decided
        self._follow([row.committed(transition.move)], [])

    def _settle_one(self, report: Report, transition: Transition) -> Settled | None:
        """Settle one attempt; None (after logging why) when nothing was recorded."""
        written = self._persist([report], lambda _live: self._store.settle(
            [self._settlement(report, transition)]))
        if written is None:
            self._gave_up([report])
            return None
        if not written[1]:
            self._stale(report)
            self._follow([], [report])
            return None
        return written[1][0]

    def _committed(self, report: Report, move: transitions.Move) -> Committed:
        attempt = report.attempt
        return Committed(move, attempt.job_id, attempt.queue, attempt.job.priority,
                         self._worker_id)

    def _completed(self, report: Report) -> None:
        attempt = report.attempt
        _JOB_COMPLETED(self._types(attempt.job.type), attempt.queue).inc()
        if log.isEnabledFor(logging.INFO):  # spares building the fields per job
            log.info("job succeeded", extra=attempt.log_extra("succeeded"))
        self._traced(report, "succeeded")

    def _stale(self, report: Report) -> None:
        attempt = report.attempt
        STALE_COMPLETIONS.labels(attempt.queue).inc()
        log.warning("outcome rejected: the lease is no longer ours", extra=attempt.log_extra(
            "stale_outcome", outcome=report.outcome.value))
        self._traced(report, "stale_outcome", "the lease is no longer ours")

    def _gave_up(self, reports: list[Report]) -> None:
        for report in reports:
            log.error("outcome not recorded: the lease lapsed while PostgreSQL was unreachable; "
                      "the job will run again", extra=report.attempt.log_extra(
                          "outcome_given_up", outcome=report.outcome.value))
            self._traced(report, "outcome_given_up", "the lease lapsed before the write")

    def _traced(self, report: Report, event: str, error: str | None = None) -> None:
        """The attempt's `complete` span: from the handler's end to its outcome's write."""
        tracing.record("complete", report.attempt.job, self._worker_id, report.reported_ns,
                       time.time_ns(), error, **{"taskline.outcome": event})

    def _follow(self, committed: list[Committed], stale: list[Report]) -> None:
        """Redis after PostgreSQL: each recorded move's step, and stale ids acked away."""
        if committed and self._on_settled is not None:
            self._on_settled(committed)  # leases released: flow budget freed
        mirror = self._mirror
        if mirror is None:
            return  # no Redis (taskline.testing.drain): PostgreSQL alone dispatches
        if committed:
            # An unblocked workflow step is announced through PostgreSQL when Redis is down.
            mirror.follow(committed, action="redis_after_record")
        if stale:
            items = [(r.attempt.queue, r.attempt.job_id) for r in stale]
            # Redis down counts toward the Mirror's one outage (the worker claims from
            # PostgreSQL; reconciliation rebuilds Redis), not one log line per outcome.
            mirror.write(lambda: mirror.dispatcher.ack(items, self._worker_id),
                         action="stale_ack", jobs=len(items))


def _wait_first(state: tenacity.RetryCallState) -> None:
    """Before the retry loop's first try, the write's second: the first wait (tenacity's own
    waits come between the loop's tries)."""
    if state.attempt_number == 1:
        time.sleep(RETRY_FIRST_WAIT_S)
