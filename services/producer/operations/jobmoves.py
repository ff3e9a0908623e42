"""Moves an operator asks of existing jobs: cancel a job, requeue a dead one, cancel a workflow's
steps. Each use case owns the whole of its move: the conditional UPDATE in PostgreSQL, the
metric, the log line, the audit record, then Redis (through the Mirror) and the workflow
dependents the move released or cancelled.

Invariant: Redis follows only a committed move, and a Redis failure after it is the Mirror's to
log (reconciliation repairs Redis), never a failure of the move. A result says what happened;
the route turns it into an answer.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from taskline import transitions
from taskline.errors import StoreUnavailable
from taskline.jobs import Job, Status
from taskline.log import job_fields as job_log_extra
from taskline.metrics import ORDERING_TURNS
from taskline.transitions import Committed, Move
from taskline_producer.http.auth import principal
from taskline_producer.operations import auditing
from taskline_producer.operations.backends import backends

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Moved:
    """`moved`: the job made the move; `stopping`: a running job was asked to stop at its next
    lease renewal. Neither: the job as it stands (`job` None: there is no such job)."""
    job: Job | None
    moved: bool = False
    stopping: bool = False


def cancel(job_id: uuid.UUID) -> Moved:
    """A pending job cancelled now; a running one asked to stop; anything else unchanged."""
    b = backends()
    actor = principal().name
    job, dependents = b.store.cancel_step(job_id, actor)
    if job is not None:
        b.metrics.cancelled(job.queue)
        log.info("job cancelled", extra=job_log_extra("cancelled", job))
        auditing.record_after("job.cancel", str(job.id), {"queue": job.queue, "type": job.type})
        _follow(transitions.CANCEL, job)
        follow_cancelled(dependents)
        follow_turns([job])
        return Moved(job, moved=True)
    job, dependents = b.store.request_cancel_step(job_id, actor)
    if job is not None:
        follow_cancelled(dependents)
        log.info("cancel requested: the worker stops the job at its next lease renewal",
                 extra=job_log_extra("cancel_requested", job))
        auditing.record_after("job.cancel_requested", str(job.id),
                              {"queue": job.queue, "type": job.type})
        return Moved(job, stopping=True)
    return Moved(b.store.get_job(job_id))


def requeue_dead(job_id: uuid.UUID) -> Moved:
    """A dead job requeued with a fresh retry budget; anything else unchanged."""
    b = backends()
    job = b.store.requeue_dead_job(job_id, principal().name)
    if job is None:
        return Moved(b.store.get_job(job_id))
    log.info("dead job requeued", extra=job_log_extra("requeued", job))
    auditing.record_after("job.retry", str(job.id), {"queue": job.queue, "type": job.type})
    _follow(transitions.REQUEUE, job)
    return Moved(job, moved=True)


@dataclass(frozen=True)
class WorkflowCancel:
    """A workflow's steps as one cancel left them: `cancelled` now, `asked` to stop. Committed
    already; `announce` records, counts and follows it once the route has accepted the answer
    (a 409 about a finished workflow announces nothing)."""
    workflow_id: uuid.UUID
    cancelled: list[Job]
    asked: list[Job]

    def announce(self) -> None:
        auditing.record_after("workflow.cancel", str(self.workflow_id),
                              {"cancelled": len(self.cancelled), "stop_requested": len(self.asked)})
        metrics = backends().metrics
        for job in self.cancelled:
            metrics.cancelled(job.queue)
        follow_cancelled(self.cancelled)
        follow_turns(self.cancelled)


def cancel_workflow(workflow_id: uuid.UUID) -> WorkflowCancel:
    """Every step of the workflow not started yet cancelled, running ones asked to stop, in one
    transaction."""
    cancelled, asked = backends().store.cancel_workflow(workflow_id, principal().name)
    return WorkflowCancel(workflow_id, cancelled, asked)


def follow_cancelled(jobs: Sequence[Job]) -> None:
    """Redis after PostgreSQL: cancelled steps leave the retry and scheduled sets; `when`
    steps the cancellations queued (status queued) are pushed."""
    if not jobs:
        return
    backends().mirror.follow([Committed(_cascade_move(j), str(j.id), j.queue, j.priority)
                              for j in jobs], action="cancel")


def follow_turns(jobs: Sequence[Job]) -> None:
    """Push the keys' next heads these jobs, cancelled before they ran, passed the turn to
    (read after the commit); if PostgreSQL cannot say, a worker's budgeted claim finds them
    within a second, as before."""
    try:
        turns = backends().store.turns_after(jobs)
    except StoreUnavailable as err:
        log.warning("could not read the turns cancelled jobs passed; workers find them within "
                    "a second", extra={"action": "cancel", "error": str(err)})
        return
    if turns:
        ORDERING_TURNS.inc(len(turns))
        backends().mirror.follow([t.committed() for t in turns], action="turn")


def _cascade_move(job: Job) -> Move:
    return transitions.UNBLOCK if job.status is Status.QUEUED else transitions.CANCEL


def _follow(move: Move, job: Job) -> None:
    backends().mirror.follow([Committed(move, str(job.id), job.queue, job.priority)],
                             action=move.name)
