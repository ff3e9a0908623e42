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

import uuid
from typing import Any

from flask import Blueprint, Response, jsonify, request

from taskline import tracing
from taskline.jobspec import KEY_CODE, FieldError
from taskline.workflows import WorkflowStatus
from taskline_producer.http import listcache, waiting
from taskline_producer.operations import jobmoves, quotas, reads, replays, submission, watches
from taskline_producer.operations.backends import backends
from taskline_producer.schemas import paging, shapes
from taskline_producer.schemas.body import read_json
from taskline_producer.schemas.errors import (
    InvalidIdempotencyKey,
    InvalidState,
    NotFound,
    ValidationFailed,
)
from taskline_producer.schemas.workflowspec import WorkflowSpec, parse_workflow

bp = Blueprint("workflows", __name__, url_prefix="/api/v1/workflows")

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
    with tracing.enqueue(request.headers) as trace_context:
        submitted = submission.submit_workflow(spec, trace_context)
    if submitted.created:
        listcache.forget()
    view = _view(reads.workflow(submitted.id) or {}, submitted.id)
    response = jsonify(replays.workflow_answer(view, submitted.created))
    response.status_code = 201 if submitted.created else 200
    response.headers["Location"] = f"/api/v1/workflows/{submitted.id}"
    return response


def _invalid(errors: list[FieldError]) -> Exception:
    keys = [e.to_dict() for e in errors if e.code == KEY_CODE]
    if keys:
        return InvalidIdempotencyKey(details=keys)
    return ValidationFailed(details=[e.to_dict() for e in errors])


@bp.get("/<uuid:workflow_id>")
def get_workflow(workflow_id: uuid.UUID) -> Response:
    """The workflow with one page of its steps (`limit`, `cursor`: STEP_PAGE, MAX_STEP_PAGE);
    with `wait_s`, once it is no longer running or `wait_s` has passed."""
    size = paging.limit(request.args, STEP_PAGE, MAX_STEP_PAGE)
    after = paging.decode_id_cursor(request.args.get("cursor"))
    seconds = waiting.wait_s()

    def read() -> tuple[dict, bool]:
        row = reads.workflow(workflow_id)
        if row is None:
            raise NotFound("no workflow has this id", {"id": str(workflow_id)})
        view = _view(row, workflow_id, after, size)
        return view, view["status"] != WorkflowStatus.RUNNING

    return jsonify(waiting.answer([str(workflow_id)], seconds, read,
                                  watch=lambda: watches.watch_workflow(workflow_id)))


@bp.get("")
@listcache.cached
def list_workflows() -> Response:
    """Workflows newest first, each with its step counts by status, never its steps: a page's
    size is bounded by its length alone, whatever its workflows hold."""
    size = paging.limit(request.args)
    after = paging.decode_cursor(request.args.get("cursor"))
    rows = reads.workflows_page(after, size + 1)
    page = rows[:size]
    counts = reads.step_counts([r["id"] for r in page])
    cursor = (paging.encode_cursor(page[-1]["created_at"], page[-1]["id"])
              if len(rows) > size else None)
    summaries = [shapes.workflow_summary(r, counts.get(r["id"], shapes.NO_STEPS)) for r in page]
    return jsonify({"workflows": summaries, "next_cursor": cursor})


@bp.delete("/<uuid:workflow_id>")
def cancel_workflow(workflow_id: uuid.UUID) -> Response:
    """Cancel every step not started yet and ask running ones to stop (200); 409 when the
    workflow has finished, 404 when there is none."""
    row = reads.workflow(workflow_id)
    if row is None:
        raise NotFound("no workflow has this id", {"id": str(workflow_id)})
    moves = jobmoves.cancel_workflow(workflow_id)
    listcache.forget()
    view = _view(row, workflow_id)
    if not moves.cancelled and not moves.asked and view["status"] != "running":
        raise InvalidState(f"a {view['status']} workflow cannot be cancelled",
                           {"id": str(workflow_id), "status": view["status"]})
    moves.announce()
    return jsonify(view)


def _view(row: dict[str, Any], workflow_id: uuid.UUID, after: uuid.UUID | None = None,
          size: int = STEP_PAGE) -> dict[str, Any]:
    """The workflow's summary with one page of its steps: at most `size` steps, fewer when
    their `after` lists would pass MAX_PAGE_EDGES (at least one step a page)."""
    counts, steps = reads.workflow_steps(workflow_id, after, size + 1)
    counts = counts or shapes.NO_STEPS
    page, edges = [], 0
    for step in steps[:size]:
        edges += len(step["after"])
        if page and edges > MAX_PAGE_EDGES:
            break
        page.append(step)
    more = len(page) < len(steps)
    return {**shapes.workflow_summary(row, counts),
            "steps": [shapes.workflow_step(s) for s in page],
            "next_cursor": paging.encode_id_cursor(page[-1]["id"]) if more else None}
