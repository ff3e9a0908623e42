"""The scope every /api/v1 route needs, by endpoint: the one table docs/api.md mirrors.

Invariant: a route under /api/ that is missing from this table is refused to every token
(403, fail closed) and fails tests/integration/test_api_scopes.py, so a new route cannot be
reachable without someone deciding which scope it needs. `ANY_SCOPE` routes (who am I) need a
principal holding at least one scope, so a JWT without `scope` is refused everywhere.
"""

from __future__ import annotations

from taskline.access import OPERATE, READ, WRITE

ANY_SCOPE = "any"
"""Needs a principal holding at least one scope, whichever."""

ROUTE_SCOPES: dict[str, str] = {
    "jobs.create_job": WRITE,
    "jobs.create_batch": WRITE,
    "jobs.get_job": READ,
    "jobs.list_jobs": READ,
    "jobs.cancel_job": OPERATE,
    "jobs.retry_job": OPERATE,
    "operations.list_dead": READ,
    "operations.dead_groups": READ,
    "operations.list_workers": READ,
    "operations.list_queues": READ,
    "jobtypes.list_types": READ,
    "events.stream": READ,
    "apidoc.openapi": READ,
    "access.whoami": ANY_SCOPE,
    "audit.list_audit": OPERATE,
    "workflows.create_workflow": WRITE,
    "workflows.get_workflow": READ,
    "workflows.list_workflows": READ,
    "workflows.cancel_workflow": OPERATE,
    "pauses.pause_queue": OPERATE,
    "pauses.resume_queue": OPERATE,
    "limits.put_limit": OPERATE,
    "limits.list_limits": READ,
    "limits.delete_limit": OPERATE,
    "schedules.put_schedule": OPERATE,
    "schedules.get_schedule": READ,
    "schedules.list_schedules": READ,
    "schedules.delete_schedule": OPERATE,
    "bulkdlq.retry_dead": OPERATE,
    "bulkdlq.purge_dead": OPERATE,
}


def allowed(endpoint: str, scopes: frozenset[str]) -> str | None:
    """None when `scopes` may call `endpoint`; otherwise the scope that is missing."""
    needed = ROUTE_SCOPES.get(endpoint)
    if needed is None:
        return "(none assigned to this route)"
    if needed == ANY_SCOPE:
        return None if scopes else "any scope"
    return None if needed in scopes else needed
