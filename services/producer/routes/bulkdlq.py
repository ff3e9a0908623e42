"""Bulk dead-letter routes: POST /api/v1/dlq/retry and POST /api/v1/dlq/purge.

What a call does, batch by batch, and why it answers `remaining` is the use case's
(taskline_producer.operations.bulkdlq).
"""

from __future__ import annotations

from flask import Blueprint, Response, jsonify, request

from taskline_producer.operations import bulkdlq
from taskline_producer.operations.backends import backends
from taskline_producer.schemas.body import read_json
from taskline_producer.schemas.bulkspec import BulkRequest, parse_bulk
from taskline_producer.schemas.errors import ValidationFailed

bp = Blueprint("bulkdlq", __name__, url_prefix="/api/v1/dlq")


def _parsed() -> BulkRequest:
    bulk = parse_bulk(read_json(request, backends().settings.max_payload_bytes))
    if not isinstance(bulk, BulkRequest):
        raise ValidationFailed(details=[e.to_dict() for e in bulk])
    return bulk


@bp.post("/retry")
def retry_dead() -> Response:
    """Requeue matching dead jobs, each with a fresh retry budget."""
    result = bulkdlq.retry(_parsed())
    return jsonify({"requeued": result.done, "remaining": result.remaining})


@bp.post("/purge")
def purge_dead() -> Response:
    """Delete matching dead jobs with their events, leases and DLQ rows."""
    result = bulkdlq.purge(_parsed())
    return jsonify({"purged": result.done, "remaining": result.remaining})
