"""Setting and removing flow limits: the row with its audit record in one transaction, and a
removed limit's held jobs handed to Redis.

Invariant: removing a limit hands the jobs it held back to Redis in order, most urgent first, as
they would have been dispatched without it; what is left (Redis down, or a long backlog)
reconciliation pushes within its interval.
"""

from __future__ import annotations

import logging
from typing import Any

from taskline import flow
from taskline.errors import DispatchUnavailable
from taskline_producer.operations import auditing
from taskline_producer.operations.backends import backends
from taskline_producer.schemas.shapes import flow_limit

log = logging.getLogger(__name__)

RELEASE_PAGE = 1000


def put(scope: str, limit: flow.Limit) -> dict[str, Any]:
    """Create or replace the limit of `scope`; its row (`created` says which)."""
    b = backends()
    with b.store.transaction() as conn:
        row = b.store.put_flow_limit(limit, conn)
        auditing.record_in(conn, "limit.set", scope, flow_limit(row))
    log.info("flow limit set", extra={"action": "limit_set", "scope": scope})
    return row


def listed() -> list[dict[str, Any]]:
    """Every limit with what it holds now (running, started, held)."""
    return backends().store.list_flow_limits()


def remove(scope: str) -> tuple[dict[str, Any], int] | None:
    """Remove the limit of `scope`: (its last row, the held jobs pushed); None: no limit."""
    b = backends()
    with b.store.transaction() as conn:
        row = b.store.delete_flow_limit(scope, conn)
        if row is not None:
            auditing.record_in(conn, "limit.delete", scope, flow_limit(row))
    if row is None:
        return None
    released = _release(scope)
    log.info("flow limit removed", extra={"action": "limit_deleted", "scope": scope,
                                          "released": released})
    return row, released


def _release(scope: str) -> int:
    """Push the jobs the removed limit held back to Redis, a page at a time."""
    b = backends()
    released, after = 0, None
    try:
        while page := b.store.released_of_scope(scope, RELEASE_PAGE, after):
            b.dispatcher.push([(r.queue, r.priority, str(r.id)) for r in page])
            released += len(page)
            last = page[-1]
            after = (last.priority, last.created_at, last.id)
            if len(page) < RELEASE_PAGE:
                break
    except DispatchUnavailable as err:
        log.warning("jobs held by a removed limit not pushed; reconciliation pushes them",
                    extra={"action": "limit_release", "scope": scope, "error": str(err)})
    return released
