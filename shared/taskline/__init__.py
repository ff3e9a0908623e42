"""taskline: a fault-tolerant distributed job engine; this package is the common library.

PostgreSQL is the source of truth and Redis only dispatches ids. Handlers register with
`@handler("type")` (declaring their payload type with `payload=`: docs/handlers.md) and receive
a `JobContext`; producers enqueue inside their own transaction with `enqueue(conn, ...)` and
`enqueue_many` (awaited on an async connection: `aenqueue`, `aenqueue_many`), or through a
declared handler (`send_receipt.enqueue(conn, Receipt(...))`), or talk to the API, or use
`Client` / `AsyncClient` (docs/client.md). `wait(conn, id, timeout)` blocks until a job
finishes, woken by the commit that finishes it (no API needed). The package ships `py.typed`.

`import taskline` loads only the exceptions: every other public name is imported from its
module on first use (PEP 562), so a process that needs one part (the `taskline` client commands,
a producer that only calls `Client`) does not pay for SQLAlchemy, psycopg and the store.
"""

from __future__ import annotations

import importlib
import uuid
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from taskline.errors import (
    AlreadyStarted,
    IdempotencyConflict,
    InvalidJob,
    JobCancelled,
    JobFailed,
    NonRetryableError,
    QueueLimitReached,
    RetryableError,
    Snooze,
    TasklineError,
)

if TYPE_CHECKING:
    from taskline.client import AsyncClient, Client, ClientError
    from taskline.enqueuing import (
        DebounceOptions,
        JobRequest,
        Payload,
        Priority,
        UniqueOptions,
        aenqueue,
        aenqueue_many,
        enqueue,
        enqueue_many,
    )
    from taskline.finishing import wait
    from taskline.handlers.declared import Handler, InvalidPayload
    from taskline.handlers.registry import JobContext, handler, periodic
    from taskline.settings import Settings
    from taskline.store.caller import AppConnection, AsyncAppConnection

# Where each lazily imported public name lives.
_HOMES = {
    **dict.fromkeys(("AsyncClient", "Client", "ClientError"), "taskline.client"),
    **dict.fromkeys(("DebounceOptions", "JobRequest", "Payload", "Priority", "UniqueOptions",
                     "aenqueue", "aenqueue_many", "enqueue", "enqueue_many"),
                    "taskline.enqueuing"),
    "wait": "taskline.finishing",
    **dict.fromkeys(("Handler", "InvalidPayload"), "taskline.handlers.declared"),
    **dict.fromkeys(("JobContext", "handler", "periodic"), "taskline.handlers.registry"),
    "Settings": "taskline.settings",
    **dict.fromkeys(("AppConnection", "AsyncAppConnection"), "taskline.store.caller"),
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'taskline' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


__all__ = ["AlreadyStarted", "AsyncClient", "Client", "ClientError", "DebounceOptions", "Handler",
           "IdempotencyConflict", "InvalidJob", "InvalidPayload", "JobCancelled", "JobContext",
           "JobFailed", "JobRequest", "NonRetryableError", "Payload", "Priority",
           "QueueLimitReached", "RetryableError", "Snooze", "TasklineError", "UniqueOptions",
           "aenqueue", "aenqueue_many", "asubmit_workflow", "enqueue", "enqueue_many", "handler",
           "periodic", "submit_workflow", "wait"]


def submit_workflow(conn: AppConnection, name: str, steps: Iterable[Mapping[str, Any]], *,
                    idempotency_key: str | None = None,
                    settings: Settings | None = None) -> uuid.UUID:
    """Insert a workflow (`steps` as POST /api/v1/workflows takes them: `{"id", "job",
    "after", "when"}`) through `conn` (what `enqueue` accepts: a SQLAlchemy Connection, Session or
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


async def asubmit_workflow(conn: AsyncAppConnection, name: str,
                           steps: Iterable[Mapping[str, Any]], *,
                           idempotency_key: str | None = None,
                           settings: Settings | None = None) -> uuid.UUID:
    """`submit_workflow` on an async connection (what `aenqueue` accepts), awaited."""
    from taskline.workflows import ainsert_workflow, step_from_dict

    submitted = await ainsert_workflow(
        conn, name, [step_from_dict(s) for s in steps], idempotency_key=idempotency_key,
        announce=True, schema=settings.schema if settings is not None else "taskline",
        max_queues=settings.max_queues if settings is not None else 1000)
    return submitted.id
