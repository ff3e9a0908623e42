"""GET /api/v1/audit: the audit trail of operator actions, newest first, by actor and action.

Recording (in the same transaction or after a commit) is taskline_producer.operations.auditing;
this module only reads the trail.
"""

from __future__ import annotations

import re
from typing import Any

from flask import Blueprint, Response, jsonify, request
from werkzeug.datastructures import MultiDict

from taskline_producer.operations import auditing
from taskline_producer.schemas import paging
from taskline_producer.schemas.errors import InvalidParameter
from taskline_producer.schemas.shapes import plain

bp = Blueprint("audit", __name__, url_prefix="/api/v1")

_ACTION = re.compile(r"[a-z0-9_.:-]{1,100}")
MAX_ACTOR_CHARS = 255


def view(row: dict[str, Any]) -> dict[str, Any]:
    return {k: plain(row[k]) for k in ("id", "at", "actor", "action", "target", "detail")}


def _actor(args: MultiDict[str, str]) -> str | None:
    raw = args.get("actor")
    if raw is not None and not (1 <= len(raw) <= MAX_ACTOR_CHARS and raw.isprintable()):
        raise InvalidParameter(f"actor must be 1..{MAX_ACTOR_CHARS} printable characters",
                               {"parameter": "actor"})
    return raw


def _action(args: MultiDict[str, str]) -> str | None:
    raw = args.get("action")
    if raw is not None and not _ACTION.fullmatch(raw):
        raise InvalidParameter("action must be 1..100 of a-z 0-9 _ . : -",
                               {"parameter": "action"})
    return raw


@bp.get("/audit")
def list_audit() -> Response:
    """Audit records newest first, by actor and action, cursor-paged like the job lists."""
    args = request.args
    actor, action, size = _actor(args), _action(args), paging.limit(args)
    after = paging.decode_cursor(args.get("cursor"))
    rows = auditing.page(actor, action, after, size + 1)
    page = rows[:size]
    cursor = paging.encode_cursor(page[-1]["at"], page[-1]["id"]) if len(rows) > size else None
    return jsonify({"records": [view(row) for row in page], "next_cursor": cursor})
