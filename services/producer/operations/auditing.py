"""Recording operator actions in the audit trail, with the principal that made the request.

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
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from taskline_producer.http.auth import principal
from taskline_producer.operations.backends import backends

log = logging.getLogger(__name__)


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


def page(actor: str | None, action: str | None, after: tuple[datetime, uuid.UUID] | None,
         limit: int) -> list[dict[str, Any]]:
    """Audit records newest first, `limit` of them after the cursor position `after`."""
    return backends().store.list_audit(actor=actor, action=action, after=after, limit=limit)
