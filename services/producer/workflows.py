"""The workflows blueprint: submit a workflow of dependent steps, read one or the list, cancel.

Invariant: a workflow is validated whole before any SQL runs and inserted in one transaction
(all steps and edges or none, taskline.workflows.insert_workflow); only after the commit are
its first steps handed to Redis. Its status is derived from its steps on every read, never
stored. The list shows each workflow's step counts, never its steps; a read of one pages its
steps (STEP_PAGE, MAX_PAGE_EDGES), so no answer grows with a workflow's size. Cancelling it
cancels every step that has not started and asks running ones to stop, in one transaction,
audited.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Any

from flask import Blueprint, Response, jsonify, request

from taskline import tracing, transitions
from taskline.errors import IdempotencyConflict
from taskline.jobs import Job, Status, visible_key
from taskline.jobspec import KEY_CODE, FieldError
from taskline.metrics import WORKFLOWS_SUBMITTED
from taskline.store.rows import StepCounts
from taskline.transitions import CREATED, Committed
from taskline.workflows import Submitted, WorkflowStatus, insert_workflow, workflow_status
from taskline_producer import audit, auth, listcache, paging, quotas, replays, waiting
from taskline_producer.backends import backends
from taskline_producer.body import read_json
from taskline_producer.enqueuer import due_ms
from taskline_producer.errors import InvalidIdempotencyKey, InvalidState, NotFound, ValidationFailed
from taskline_producer.shapes import plain
from taskline_producer.workflowspec import WorkflowSpec, parse_workflow

log = logging.getLogger(__name__)

bp = Blueprint("workflows", __name__, url_prefix="/api/v1/workflows")
NO_STEPS = StepCounts({}, 0)

STEP_PAGE = 200
"""Steps in one answer of GET /api/v1/workflows/{id} (and of a submit or a cancel) unless
`limit` says otherwise."""
MAX_STEP_PAGE = 1000
"""Most steps `limit` may ask for in one page: a whole workflow of MAX_STEPS."""
MAX_PAGE_EDGES = 20_000
"""Most parent step ids (`after` entries) one page carries: a page ends early before more."""


@bp.post("")
def create_workflow() -> Response:
    b = backends()
    body = read_json(request, b.settings.max_payload_bytes)
    spec = parse_workflow(body, b.settings, request.headers.get("Idempotency-Key"))
    if not isinstance(spec, WorkflowSpec):
        raise _invalid(spec)
    declared = b.declared.errors([s.job for s in spec.steps],
                                 lambda index: f"steps[{index}] ({spec.steps[index].id}).job.")
    if declared:
        raise ValidationFailed(details=[e.to_dict() for e in declared])
    spec = replays.scoped(spec)
    quotas.take(len(spec.steps))
    with tracing.enqueue(request.headers) as trace_context, b.store.transaction() as conn:
        submitted = insert_workflow(conn, spec.name, spec.steps,
                                    idempotency_key=spec.idempotency_key,
                                    request_hash=spec.request_hash, trace_context=trace_context,
                                    actor=auth.principal().name, schema=b.store.schema,
                                    max_queues=b.settings.max_queues)
        if not submitted.created:
            _check_replay(conn, spec, submitted)
    if submitted.created:
        listcache.forget()
        WORKFLOWS_SUBMITTED.inc()
        _dispatch(list(submitted.jobs.values()))
        log.info("workflow accepted", extra={"action": "workflow_submitted",
                                             "workflow_id": str(submitted.id),
                                             "steps": len(spec.steps)})
    view = _view(b.store.get_workflow(submitted.id) or {}, submitted.id)
    response = jsonify(replays.workflow_answer(view, submitted.created))
    response.status_code = 201 if submitted.created else 200
    response.headers["Location"] = f"/api/v1/workflows/{submitted.id}"
    return response


def _check_replay(conn: Any, spec: WorkflowSpec, submitted: Submitted) -> None:
    """The key names a workflow already: the same body gets it, another body is a 422."""
    found = backends().store.get_workflow_by_key(spec.idempotency_key or "", conn)
    if found is None or found["request_hash"] != spec.request_hash:
        key = visible_key(spec.idempotency_key)
        raise IdempotencyConflict(f"idempotency key {key!r} was used for workflow "
                                  f"{submitted.id} with a different body")


def _invalid(errors: list[FieldError]) -> Exception:
    keys = [e.to_dict() for e in errors if e.code == KEY_CODE]
    if keys:
        return InvalidIdempotencyKey(details=keys)
    return ValidationFailed(details=[e.to_dict() for e in errors])


def _dispatch(jobs: Sequence[Job]) -> None:
    """Push the steps that start now (waiting ones wait in PostgreSQL only)."""
    committed = [Committed(CREATED[j.status], str(j.id), j.queue, j.priority,
                           due_ms=None if j.next_run_at is None else due_ms(j.next_run_at))
                 for j in jobs]
    backends().mirror.follow(committed, action="workflow_submitted")


@bp.get("/<uuid:workflow_id>")
def get_workflow(workflow_id: uuid.UUID) -> Response:
    """The workflow with one page of its steps (`limit`, `cursor`: STEP_PAGE, MAX_STEP_PAGE);
    with `wait_s`, once it is no longer running or `wait_s` has passed."""
    size = paging.limit(request.args, STEP_PAGE, MAX_STEP_PAGE)
    after = paging.decode_id_cursor(request.args.get("cursor"))
    seconds = waiting.wait_s()

    def read() -> tuple[dict, bool]:
        row = backends().store.get_workflow(workflow_id)
        if row is None:
            raise NotFound("no workflow has this id", {"id": str(workflow_id)})
        view = _view(row, workflow_id, after, size)
        return view, view["status"] != WorkflowStatus.RUNNING

    return jsonify(waiting.answer([str(workflow_id)], seconds, read))


@bp.get("")
@listcache.cached
def list_workflows() -> Response:
    """Workflows newest first, each with its step counts by status, never its steps: a page's
    size is bounded by its length alone, whatever its workflows hold."""
    size = paging.limit(request.args)
    after = paging.decode_cursor(request.args.get("cursor"))
    store = backends().store
    rows = store.list_workflows(after=after, limit=size + 1)
    page = rows[:size]
    counts = store.workflow_step_counts([r["id"] for r in page])
    cursor = (paging.encode_cursor(page[-1]["created_at"], page[-1]["id"])
              if len(rows) > size else None)
    return jsonify({"workflows": [_summary(r, counts.get(r["id"], NO_STEPS)) for r in page],
                    "next_cursor": cursor})


@bp.delete("/<uuid:workflow_id>")
def cancel_workflow(workflow_id: uuid.UUID) -> Response:
    """Cancel every step not started yet and ask running ones to stop (200); 409 when the
    workflow has finished, 404 when there is none."""
    b = backends()
    row = b.store.get_workflow(workflow_id)
    if row is None:
        raise NotFound("no workflow has this id", {"id": str(workflow_id)})
    cancelled, asked = b.store.cancel_workflow(workflow_id, auth.principal().name)
    listcache.forget()
    view = _view(row, workflow_id)
    if not cancelled and not asked and view["status"] != "running":
        raise InvalidState(f"a {view['status']} workflow cannot be cancelled",
                           {"id": str(workflow_id), "status": view["status"]})
    audit.record_after("workflow.cancel", str(workflow_id),
                       {"cancelled": len(cancelled), "stop_requested": len(asked)})
    for job in cancelled:
        b.metrics.cancelled(job.queue)
    follow_cancelled(cancelled)
    return jsonify(view)


def follow_cancelled(jobs: Sequence[Job]) -> None:
    """Redis after PostgreSQL: cancelled steps leave the retry and scheduled sets; `when`
    steps the cancellations queued (status queued) are pushed."""
    if not jobs:
        return
    backends().mirror.follow([Committed(_cascade_move(j), str(j.id), j.queue, j.priority)
                              for j in jobs], action="cancel")


def _cascade_move(job: Job) -> transitions.Move:
    return transitions.UNBLOCK if job.status is Status.QUEUED else transitions.CANCEL


def _view(row: dict[str, Any], workflow_id: uuid.UUID, after: uuid.UUID | None = None,
          size: int = STEP_PAGE) -> dict[str, Any]:
    """The workflow's summary with one page of its steps: at most `size` steps, fewer when
    their `after` lists would pass MAX_PAGE_EDGES (at least one step a page)."""
    store = backends().store
    counts = store.workflow_step_counts([workflow_id]).get(workflow_id, NO_STEPS)
    steps = store.workflow_steps_page(workflow_id, after, size + 1)
    page, edges = [], 0
    for step in steps[:size]:
        edges += len(step["after"])
        if page and edges > MAX_PAGE_EDGES:
            break
        page.append(step)
    more = len(page) < len(steps)
    return {**_summary(row, counts), "steps": [_step(s) for s in page],
            "next_cursor": paging.encode_id_cursor(page[-1]["id"]) if more else None}


def _summary(row: dict[str, Any], counts: StepCounts) -> dict[str, Any]:
    by_status = counts.by_status
    return {"id": str(row["id"]), "name": row["name"],
            "status": workflow_status(by_status, counts.unmet),
            "created_at": plain(row["created_at"]), "steps_total": sum(by_status.values()),
            "step_counts": by_status, "condition_unmet": counts.unmet}


def _step(s: dict[str, Any]) -> dict[str, Any]:
    return {"id": s["step"], "job_id": str(s["id"]), "type": s["type"], "queue": s["queue"],
            "status": s["status"], "after": list(s["after"]), "when": s["run_when"],
            "attempts": s["attempts"], "pending_parents": s["pending_parents"],
            "last_error": s["last_error"], "cancel_cause": s["cancel_cause"],
            "updated_at": plain(s["updated_at"])}
