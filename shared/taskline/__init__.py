"""taskline: a fault-tolerant distributed job engine; this package is the common library.

PostgreSQL is the source of truth and Redis only dispatches ids. Handlers register with
`@handler("type")`; producers enqueue inside their own transaction with `enqueue(conn, ...)`
and `enqueue_many`, or talk to the API, or use `Client` / `AsyncClient` (docs/client.md).
"""

from taskline.enqueuing import enqueue, enqueue_many
from taskline.errors import IdempotencyConflict, InvalidJob, NonRetryableError, RetryableError
from taskline.handlers.registry import handler

__all__ = ["IdempotencyConflict", "InvalidJob", "NonRetryableError", "RetryableError",
           "enqueue", "enqueue_many", "handler"]
