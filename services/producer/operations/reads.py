"""What the API's reads show: every route's read of PostgreSQL and Redis, in one place.

Routes call operations and never reach the store or the dispatcher (docs/architecture.md, "The
API in layers"); the use cases that change state live beside this module (jobmoves, submission,
bulkdlq...), and these are the ones that only look. A read that later needs a cache, a second
statement or Redis beside PostgreSQL changes here, not in the route that shapes its answer.

Invariant: nothing here writes. Counts and rows come from PostgreSQL (the truth); Redis depths
are read beside them and are None, with the dispatch mode `postgres`, while Redis is
unreachable: a read answers rather than fails on a Redis outage.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from taskline.errors import DispatchUnavailable
from taskline.jobs import Job
from taskline_producer.operations.backends import backends
from taskline_producer.operations.dispatch_state import dispatch_state, unreachable


def job_with_history(job_id: uuid.UUID) -> tuple[Job, list[dict], list[dict]] | None:
    """The job, its events and its leases; None when no job has this id."""
    store = backends().store
    job = store.get_job(job_id)
    if job is None:
        return None
    events, leases = store.get_history(job_id)
    return job, events, leases


def jobs_page(filters: dict[str, Any], after: tuple[datetime, uuid.UUID] | None,
              limit: int) -> list[Job]:
    return backends().store.list_jobs(**filters, after=after, limit=limit)


def dead_page(queue: str | None, after: tuple[datetime, uuid.UUID] | None,
              limit: int) -> list[dict]:
    return backends().store.list_dead(queue=queue, after=after, limit=limit)


def dead_groups(queue: str | None, limit: int) -> list[Any]:
    return backends().store.dlq_groups(queue=queue, limit=limit)


def live_workers() -> list[Any]:
    """Workers heard from within three heartbeats."""
    b = backends()
    return b.store.list_workers(within_s=3 * b.settings.heartbeat_s)


def declared_types() -> list[Any]:
    """Types declared by a worker seen within TASKLINE_TYPE_TTL_S."""
    b = backends()
    return b.store.list_declared_types(b.settings.type_ttl_s)


def schedule(name: str) -> Any | None:
    return backends().store.get_schedule(name)


def schedules_page(after: str | None, limit: int) -> list[Any]:
    return backends().store.list_schedules(after, limit)


def workflow(workflow_id: uuid.UUID) -> dict[str, Any] | None:
    return backends().store.get_workflow(workflow_id)


def workflows_page(after: tuple[datetime, uuid.UUID] | None, limit: int) -> list[dict[str, Any]]:
    return backends().store.list_workflows(after=after, limit=limit)


def step_counts(workflow_ids: list[uuid.UUID]) -> dict[uuid.UUID, Any]:
    """Each workflow's steps counted by status (a workflow without steps is absent)."""
    return backends().store.workflow_step_counts(workflow_ids)


def workflow_steps(workflow_id: uuid.UUID, after: uuid.UUID | None,
                   limit: int) -> tuple[Any | None, list[dict[str, Any]]]:
    """The workflow's step counts by status (None when it has no steps) and a page of its
    steps after step `after`."""
    store = backends().store
    counts = store.workflow_step_counts([workflow_id]).get(workflow_id)
    return counts, store.workflow_steps_page(workflow_id, after, limit)


def newest_events_after(after: int, upto: int, limit: int) -> list[Any]:
    """The newest `limit` history entries in (after, upto], oldest first (a stream's replay)."""
    return backends().store.newest_events_after(after, upto, limit)


def reachability() -> dict[str, Callable[[], Any]]:
    """A ping of each backend, by the name readiness reports it under."""
    b = backends()
    return {"postgresql": b.store.ping, "redis": b.dispatcher.ping}


@dataclass(frozen=True)
class QueuesPage:
    """One page of queue names with what PostgreSQL counts of every queue, the pauses, the
    page's Redis depths (None while Redis is unreachable) and the dispatch mode."""

    names: list[str]
    more: bool
    counts: list[Any]
    paused: dict[str, Any]
    depths: dict[str, Any] | None
    dispatch: dict[str, Any]


def queues_page(after: str | None, size: int, valid: Callable[[str], bool]) -> QueuesPage:
    """Queues by name after `after`: those PostgreSQL counts, those paused and those Redis
    knows (while it answers), `valid` names only."""
    b = backends()
    counts = list(b.store.queue_counts())
    paused = b.store.paused_queues()
    dispatch = dispatch_state(b.store, b.dispatcher)
    known: set[str] = set()
    if dispatch["redis"] == "ok":
        try:
            known = b.dispatcher.known_queues()
        except DispatchUnavailable:
            dispatch = unreachable()
    names = sorted(n for n in known | {row.queue for row in counts} | set(paused)
                   if valid(n) and (after is None or n > after))
    page = names[:size]
    depths = _depths(b.dispatcher, page) if dispatch["redis"] == "ok" else None
    if depths is None and dispatch["redis"] == "ok":
        dispatch = unreachable()
    return QueuesPage(page, len(names) > size, counts, paused, depths, dispatch)


def _depths(dispatcher: Any, names: list[str]) -> dict[str, Any] | None:
    """Redis depths of the queues `names`; None when Redis stops answering."""
    try:
        return dispatcher.depths_of(names)
    except DispatchUnavailable:
        return None
