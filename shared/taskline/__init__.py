"""taskline: a fault-tolerant distributed job engine; this package is the common library.

PostgreSQL is the source of truth and Redis only dispatches ids. Handlers register with
`@handler("type")`; producers enqueue inside their own transaction with `enqueue(conn, ...)`
and `enqueue_many` (awaited on an async connection: `aenqueue`, `aenqueue_many`), or talk to the
API, or use `Client` / `AsyncClient` (docs/client.md).
"""

from taskline.enqueuing import aenqueue, aenqueue_many, enqueue, enqueue_many
from taskline.errors import (
    AlreadyStarted,
    IdempotencyConflict,
    InvalidJob,
    NonRetryableError,
    RetryableError,
)
from taskline.handlers.registry import handler

__all__ = ["AlreadyStarted", "IdempotencyConflict", "InvalidJob", "NonRetryableError",
           "RetryableError",
           "aenqueue", "aenqueue_many", "asubmit_workflow", "enqueue", "enqueue_many",
           "handler", "submit_workflow"]


def submit_workflow(conn, name, steps, *, idempotency_key=None,  # type: ignore[no-untyped-def]
                    settings=None):
    """Insert a workflow (`steps` as POST /api/v1/workflows takes them: `{"id", "job",
    "after"}`) through `conn` (what `enqueue` accepts: a SQLAlchemy Connection, Session or
    scoped_session, or a psycopg Connection), inside the caller's transaction; it exists only
    if that transaction commits. Returns the workflow's id. Its first steps are owed to Redis
    through the enqueue outbox, as `enqueue` owes a job, so a worker starts them right after
    the commit (docs/workflows.md). `settings` names the installation's schema
    (TASKLINE_SCHEMA) and its queue limit (TASKLINE_MAX_QUEUES: QueueLimitReached); the
    default ones if None."""
    from taskline.workflows import insert_workflow, step_from_dict

    return insert_workflow(conn, name, [step_from_dict(s) for s in steps],
                           idempotency_key=idempotency_key, announce=True,
                           schema=settings.schema if settings is not None else "taskline",
                           max_queues=settings.max_queues if settings is not None else 1000).id


async def asubmit_workflow(conn, name, steps, *,  # type: ignore[no-untyped-def]
                           idempotency_key=None, settings=None):
    """`submit_workflow` on an async connection (what `aenqueue` accepts), awaited."""
    from taskline.workflows import ainsert_workflow, step_from_dict

    submitted = await ainsert_workflow(
        conn, name, [step_from_dict(s) for s in steps], idempotency_key=idempotency_key,
        announce=True, schema=settings.schema if settings is not None else "taskline",
        max_queues=settings.max_queues if settings is not None else 1000)
    return submitted.id
