"""taskline: a fault-tolerant distributed job engine; this package is the common library.

PostgreSQL is the source of truth and Redis only dispatches ids. Handlers register with
`@handler("type")`; producers talk to the API, or use `Client`.
"""

from taskline.errors import NonRetryableError, RetryableError
from taskline.handlers.registry import handler

__all__ = ["NonRetryableError", "RetryableError", "handler", "submit_workflow"]


def submit_workflow(conn, name, steps, *, idempotency_key=None):  # type: ignore[no-untyped-def]
    """Insert a workflow (`steps` as POST /api/v1/workflows takes them: `{"id", "job",
    "after"}`) through `conn`, a SQLAlchemy Connection to taskline's database, inside the
    caller's transaction; it exists only if that transaction commits. Returns the workflow's
    id. Its first steps reach Redis by reconciliation (docs/workflows.md)."""
    from taskline.workflows import insert_workflow, step_from_dict

    return insert_workflow(conn, name, [step_from_dict(s) for s in steps],
                           idempotency_key=idempotency_key).id
