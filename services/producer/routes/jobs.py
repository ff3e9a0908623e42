"""The jobs blueprint: enqueue (one or a batch), read, list, cancel and requeue jobs.

Invariant: every route validates fully before it touches PostgreSQL (job ids are matched by
the router's uuid converter, so anything else is a 404 before any SQL), and every state change
is one conditional UPDATE in PostgreSQL that Redis follows afterwards; a Redis failure after
the change is logged, never reported as a failure of the change.
"""

from __future__ import annotations

import uuid

from flask import Blueprint, Response, jsonify, request

from taskline import tracing
from taskline.jobs import Job
from taskline.jobspec import KEY_CODE, FieldError, JobSpec, parse_batch, parse_job
from taskline_producer.http import auth, waiting
from taskline_producer.operations import jobmoves, quotas, reads, replays, watches
from taskline_producer.operations.backends import backends
from taskline_producer.schemas import paging, shapes
from taskline_producer.schemas.body import read_json
from taskline_producer.schemas.errors import (
    InvalidIdempotencyKey,
    InvalidState,
    NotFound,
    ValidationFailed,
)

bp = Blueprint("jobs", __name__, url_prefix="/api/v1/jobs")


def _location(job_id: uuid.UUID) -> str:
    return f"/api/v1/jobs/{job_id}"


@bp.post("")
def create_job() -> Response:
    b = backends()
    body = read_json(request, b.settings.max_payload_bytes)
    spec = parse_job(body, b.settings, request.headers.get("Idempotency-Key"))
    if not isinstance(spec, JobSpec):
        raise _invalid(spec)
    _check_declared(b.declared.errors([spec]))
    quotas.take(1)
    with tracing.enqueue(request.headers) as trace_context:
        accepted = b.enqueuer.enqueue(replays.scoped(spec), trace_context, auth.principal().name)
        tracing.accepted([accepted.job])
    response = jsonify({**replays.job_answer(shapes.job(accepted.job), accepted.created),
                        **accepted.flags()})
    response.status_code = 201 if accepted.created else 200
    response.headers["Location"] = _location(accepted.job.id)
    return response


@bp.post("/batch")
def create_batch() -> Response:
    b = backends()
    body = read_json(request, b.settings.max_payload_bytes)
    if "Idempotency-Key" in request.headers:
        raise ValidationFailed(details=[{"field": "Idempotency-Key", "message":
                                         "a batch takes idempotency_key per job"}])
    parsed = parse_batch(body, b.settings)
    errors = [e for e in parsed if isinstance(e, FieldError)]
    if errors:
        raise _invalid(errors)
    specs = [s for s in parsed if isinstance(s, JobSpec)]
    _check_declared(b.declared.errors(specs, lambda index: f"jobs[{index}]."))
    quotas.take(len(parsed))
    with tracing.enqueue(request.headers) as trace_context:
        accepted = b.enqueuer.enqueue_many(replays.scoped_all(specs), trace_context,
                                           auth.principal().name)
        tracing.accepted([a.job for a in accepted])
    created = sum(a.created for a in accepted)
    response = jsonify({
        "jobs": [{"index": i, "created": a.created, **a.flags(),
                  "job": replays.job_answer(shapes.job(a.job), a.created)}
                 for i, a in enumerate(accepted)],
        "created": created, "replayed": len(accepted) - created})
    response.status_code = 201 if created else 200
    return response


def _invalid(errors: list[FieldError]) -> Exception:
    """A key that breaks the key rule is a 400 (one rule for header and body); else a 422."""
    keys = [e.to_dict() for e in errors if e.code == KEY_CODE]
    if keys:
        return InvalidIdempotencyKey(details=keys)
    return ValidationFailed(details=[e.to_dict() for e in errors])


def _check_declared(errors: list[FieldError]) -> None:
    """A payload breaking its declared type (or, under reject, an undeclared type): 422."""
    if errors:
        raise ValidationFailed(details=[e.to_dict() for e in errors])


@bp.get("/<uuid:job_id>")
def get_job(job_id: uuid.UUID) -> Response:
    """The job with its history; with `wait_s`, once it is finished or `wait_s` has passed."""
    seconds = waiting.wait_s()
    return jsonify(waiting.answer([str(job_id)], seconds, lambda: _job_detail(job_id),
                                  lambda: waiting.job_reply(str(job_id)),
                                  watch=lambda: watches.watch_job(job_id)))


def _job_detail(job_id: uuid.UUID) -> tuple[dict, bool]:
    found = reads.job_with_history(job_id)
    if found is None:
        raise NotFound(details={"id": str(job_id)})
    job, events, leases = found
    return shapes.job_detail(job, events, leases), job.status.terminal


@bp.get("")
def list_jobs() -> Response:
    args = request.args
    filters = {"status": paging.status(args), "type": paging.job_type(args),
               "queue": paging.queue(args), "tag": paging.tag(args)}
    size = paging.limit(args)
    after = paging.decode_cursor(args.get("cursor"))
    rows = reads.jobs_page(filters, after, size + 1)
    page = rows[:size]
    more = len(rows) > size
    cursor = paging.encode_cursor(page[-1].created_at, page[-1].id) if more else None
    return jsonify({"jobs": [shapes.job(j) for j in page], "next_cursor": cursor})


@bp.delete("/<uuid:job_id>")
def cancel_job(job_id: uuid.UUID) -> Response:
    """Pending: cancelled now (200). Running: asked to stop at its next renewal (202)."""
    result = jobmoves.cancel(job_id)
    if not (result.moved or result.stopping):
        raise _not_in_state(result.job, job_id, "cancelled")
    response = jsonify(shapes.job(result.job))
    if result.stopping:
        response.status_code = 202
    return response


@bp.post("/<uuid:job_id>/retry")
def retry_job(job_id: uuid.UUID) -> Response:
    """Requeue a dead job with a fresh retry budget; anything else is a 409."""
    result = jobmoves.requeue_dead(job_id)
    if not result.moved:
        raise _not_in_state(result.job, job_id, "retried (only dead jobs can)")
    return jsonify(shapes.job(result.job))


def _not_in_state(job: Job | None, job_id: uuid.UUID, action: str) -> Exception:
    if job is None:
        return NotFound(details={"id": str(job_id)})
    return InvalidState(f"a {job.status} job cannot be {action}",
                        {"id": str(job_id), "status": job.status.value})
