"""The schedules blueprint: create or replace, read, list and remove periodic jobs.

Invariant: a body is validated whole (taskline_producer.schemas.schedulespec) before any SQL runs,
and a change and its audit record commit in one transaction; a creation that would make more than
TASKLINE_MAX_SCHEDULES schedules rolls back (422; concurrent creations may pass it by at most their
number). The schedule records the principal that wrote it, whose enqueue quota its slots' jobs count
against (taskline.schedules.QUOTA_CLIENT); it is never shown. A name outside the name rule names no
schedule: GET and DELETE answer 404 before any SQL. `next_runs` are
computed from the stored definition in PostgreSQL's clock; a paused schedule has none.
Removing a schedule leaves its jobs and the record of its fired slots where they are. The
changes are the use case's (taskline_producer.operations.scheduling).
"""

from __future__ import annotations

from flask import Blueprint, Response, jsonify, request

from taskline.schedules import valid_name
from taskline_producer.operations import reads, scheduling
from taskline_producer.operations.backends import backends
from taskline_producer.operations.declared import Checked
from taskline_producer.schemas import paging, shapes
from taskline_producer.schemas.body import read_json
from taskline_producer.schemas.errors import NotFound, ValidationFailed
from taskline_producer.schemas.schedulespec import ScheduleSpec, parse_schedule

bp = Blueprint("schedules", __name__, url_prefix="/api/v1/schedules")


@bp.put("/<name>")
def put_schedule(name: str) -> Response:
    b = backends()
    body = read_json(request, b.settings.max_payload_bytes)
    spec = parse_schedule(name, body, b.settings)
    if not isinstance(spec, ScheduleSpec):
        raise ValidationFailed(details=[e.to_dict() for e in spec])
    # Every slot would enqueue this job: a payload its type refuses is refused now, once.
    declared = b.declared.errors([Checked(spec.job["type"], spec.job["payload"])],
                                 lambda index: "job.")
    if declared:
        raise ValidationFailed(details=[e.to_dict() for e in declared])
    row, created = scheduling.put(spec)
    response = jsonify(shapes.schedule(row))
    response.status_code = 201 if created else 200
    response.headers["Location"] = f"/api/v1/schedules/{spec.name}"
    return response


@bp.get("/<name>")
def get_schedule(name: str) -> Response:
    row = reads.schedule(name) if valid_name(name) else None
    if row is None:
        raise NotFound("no schedule has this name", {"name": name})
    return jsonify(shapes.schedule(row))


@bp.get("")
def list_schedules() -> Response:
    args = request.args
    size = paging.limit(args)
    # A schedule name of MAX_NAME_CHARS characters takes more than the time cursors' bound.
    after = paging.decode_name_cursor(args.get("cursor"), valid_name,
                                      2 * paging.MAX_CURSOR_CHARS)
    rows = reads.schedules_page(after, size + 1)
    page = rows[:size]
    cursor = paging.encode_name_cursor(page[-1].name) if len(rows) > size else None
    return jsonify({"schedules": [shapes.schedule(r) for r in page], "next_cursor": cursor})


@bp.delete("/<name>")
def delete_schedule(name: str) -> Response:
    if not valid_name(name) or not scheduling.remove(name):
        raise NotFound("no schedule has this name", {"name": name})
    return jsonify({"name": name, "deleted": True})
