"""Submitting a workflow: its steps written in one transaction, then the steps that start now
announced in Redis.

Invariant: a replayed idempotency key returns the workflow it made, and only for the same body
(IdempotencyConflict otherwise); Redis hears of the steps only after the commit, through the
Mirror (its NOTIFY fallback when Redis is unreachable); waiting steps wait in PostgreSQL only.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from taskline.errors import IdempotencyConflict
from taskline.jobs import Job, visible_key
from taskline.metrics import WORKFLOWS_SUBMITTED
from taskline.transitions import CREATED, Committed
from taskline.workflows import Submitted, insert_workflow
from taskline_producer.http.auth import principal
from taskline_producer.operations.backends import backends
from taskline_producer.operations.enqueuer import due_ms
from taskline_producer.schemas.workflowspec import WorkflowSpec

log = logging.getLogger(__name__)


def submit_workflow(spec: WorkflowSpec, trace_context: str | None) -> Submitted:
    """The workflow `spec` (already scoped to its principal) written, or the one its key made."""
    b = backends()
    with b.store.transaction() as conn:
        submitted = insert_workflow(conn, spec.name, spec.steps,
                                    idempotency_key=spec.idempotency_key,
                                    request_hash=spec.request_hash, trace_context=trace_context,
                                    actor=principal().name, schema=b.store.schema,
                                    max_queues=b.settings.max_queues)
        if not submitted.created:
            _check_replay(conn, spec, submitted)
    if submitted.created:
        WORKFLOWS_SUBMITTED.inc()
        _dispatch(list(submitted.jobs.values()))
        log.info("workflow accepted", extra={"action": "workflow_submitted",
                                             "workflow_id": str(submitted.id),
                                             "steps": len(spec.steps)})
    return submitted


def _check_replay(conn: Any, spec: WorkflowSpec, submitted: Submitted) -> None:
    """The key names a workflow already: the same body gets it, another body is a 422."""
    found = backends().store.get_workflow_by_key(spec.idempotency_key or "", conn)
    if found is None or found["request_hash"] != spec.request_hash:
        key = visible_key(spec.idempotency_key)
        raise IdempotencyConflict(f"idempotency key {key!r} was used for workflow "
                                  f"{submitted.id} with a different body")


def _dispatch(jobs: Sequence[Job]) -> None:
    """Push the steps that start now (waiting ones wait in PostgreSQL only)."""
    committed = [Committed(CREATED[j.status], str(j.id), j.queue, j.priority,
                           due_ms=None if j.next_run_at is None else due_ms(j.next_run_at))
                 for j in jobs]
    backends().mirror.follow(committed, action="workflow_submitted")
