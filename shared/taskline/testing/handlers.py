"""`run_handler`: one registered handler called with a real JobContext, in the test's thread.

No worker, no Redis and, unless `conn` is given, no database: the handler's own logic under
test. With `conn`, the `ctx.on_complete` hooks it registers run on that connection, inside its
open transaction, as a worker runs them in the transaction that records the success. An
`async def` handler is run to its end on an event loop of its own.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from taskline.execution.runner import NoHandler, check_result, run_coroutine
from taskline.handlers import registry
from taskline.handlers.registry import JobContext
from taskline.jobs import new_job_id
from taskline.settings import Settings
from taskline.store import caller

WORKER_ID = "taskline-testing"
"""The `ctx.worker_id` of handlers run by taskline.testing."""


def run_handler(type: str, payload: Any = None, *, conn: Any = None,
                parent_results: Mapping[str, Any] | None = None, attempt: int = 1,
                queue: str = "default", job_id: uuid.UUID | None = None) -> Any:
    """Run the handler registered for `type` on `payload` and return its result.

    `parent_results` is what `ctx.parent_results` answers (a workflow step's parents);
    `attempt` is `ctx.attempt`. Raises what the handler raises, NoHandler for an unknown type
    (after importing TASKLINE_HANDLERS, as a worker would), and BadResult for a result that
    cannot be stored as JSON.
    """
    fn = _handler(type)
    ctx = JobContext(job_id=job_id or new_job_id(), attempt=attempt, queue=queue, type=type,
                     worker_id=WORKER_ID)
    ctx._parent_results = dict(parent_results or {})
    result = fn.run(payload, ctx)  # validated into its declared payload type, as a worker does
    if fn.is_async:
        result = run_coroutine(result)
    check_result(result)
    if conn is not None:
        target = caller.sync_target(conn)
        for hook in ctx.completion_hooks:
            hook(target)
    return result


def _handler(job_type: str) -> registry.HandlerFn:
    fn = registry.get(job_type)
    if fn is None:
        # The modules a worker would import for its registrations, when the test has not.
        registry.load(Settings.from_env().handlers)
        fn = registry.get(job_type)
    if fn is None:
        raise NoHandler(f"no handler registered for type {job_type}")
    return fn
