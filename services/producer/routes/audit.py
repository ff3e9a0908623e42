"""The audit trail: operator actions recorded with who did them, and GET /api/v1/audit.

Invariant: records are appended, never changed (a trigger refuses UPDATE), and deleted only by
their own retention (TASKLINE_RETAIN_AUDIT_S, maintenance). An action that changes the database
records itself in the same transaction (`record_in`) where it can, so the change and its record
commit together; one whose change a store method has already committed records itself after it
(`record_after`): that record can be missing only if PostgreSQL failed in between, and then
the log line holding the record says so instead of failing the answer about a change made.
Every record's `detail` names the credential its actor presented (`credential`: `token` for a
static token, `jwt` for a JWT's `sub`, `anonymous` with authentication off): a static token and
a JWT `sub` may carry the same name, and the record must tell which one acted.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from flask import Blueprint, Response, jsonify, request
from sqlalchemy import Connection
from werkzeug.datastructures import MultiDict

from taskline_producer.http.auth import principal
from taskline_producer.operations.backends import backends
from taskline_producer.schemas import paging
from taskline_producer.schemas.errors import InvalidParameter
from taskline_producer.schemas.shapes import plain

log = logging.getLogger(__name__)

bp = Blueprint("audit", __name__, url_prefix="/api/v1")

_ACTION = re.compile(r"[a-z0-9_.:-]{1,100}")
MAX_ACTOR_CHARS = 255


def with_credential(detail: dict[str, Any] | None) -> dict[str, Any]:
    """`detail` with the kind of credential the current principal presented."""
    return {**(detail or {}), "credential": principal().kind}


def record_in(conn: Connection, action: str, target: str | None = None,
              detail: dict[str, Any] | None = None) -> None:
    """Record `action` by the current principal inside the caller's transaction."""
    backends().store.insert_audit(actor=principal().name, action=action, target=target,
                                  detail=with_credential(detail), conn=conn)


def record_after(action: str, target: str | None = None,
                 detail: dict[str, Any] | None = None) -> None:
    """Record `action` by the current principal after its change committed; never raises."""
    actor = principal().name
    detail = with_credential(detail)
    try:
        backends().store.insert_audit(actor=actor, action=action, target=target, detail=detail)
    except Exception:  # the change is made; its answer must not say otherwise
        log.error("audit record not written; this line is the record", exc_info=True,
                  extra={"action": "audit_lost", "audit_action": action, "actor": actor,
                         "credential": detail["credential"], "target": target})


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
    rows = backends().store.list_audit(actor=actor, action=action, after=after,
                                       limit=size + 1)
    page = rows[:size]
    cursor = paging.encode_cursor(page[-1]["at"], page[-1]["id"]) if len(rows) > size else None
    return jsonify({"records": [view(row) for row in page], "next_cursor": cursor})
