"""Built-in handlers: `echo` and `simulate`; `webhook` lives in its own module."""

from __future__ import annotations

import random
import time
from typing import Any

from taskline.errors import JobCancelled, NonRetryableError
from taskline.handlers.registry import JobContext, handler


@handler("echo")
def echo(payload: Any, ctx: JobContext) -> Any:
    """Return the payload unchanged."""
    return payload


@handler("simulate")
def simulate(payload: Any, ctx: JobContext) -> dict[str, Any]:
    """Sleep and/or burn CPU, and fail on demand, so demos and tests get any job they need.

    Parameters: sleep_s, cpu_ms, fail_rate (0..1), fail_first (fail attempts 1..N),
    error (the message), non_retryable (fail permanently).
    """
    params = payload if isinstance(payload, dict) else {}
    _sleep(float(params.get("sleep_s", 0) or 0), ctx)
    _burn_cpu(float(params.get("cpu_ms", 0) or 0), ctx)
    if ctx.stopping:
        # Cut short by cancel, timeout, lost lease or shutdown: the work did not finish.
        raise JobCancelled("stopped before the simulated work finished")
    message = str(params.get("error") or "simulated failure")
    failing = ctx.attempt <= int(params.get("fail_first", 0) or 0)
    failing = failing or random.random() < float(params.get("fail_rate", 0) or 0)
    if failing:
        if params.get("non_retryable"):
            raise NonRetryableError(message)
        raise RuntimeError(message)
    return {"attempt": ctx.attempt}


def _sleep(seconds: float, ctx: JobContext) -> None:
    # Waiting on the stop event instead of time.sleep lets cancel and shutdown interrupt it.
    if seconds > 0:
        ctx.stop_event.wait(seconds)


def _burn_cpu(milliseconds: float, ctx: JobContext) -> None:
    deadline = time.perf_counter() + milliseconds / 1000
    while time.perf_counter() < deadline and not ctx.stopping:
        sum(i * i for i in range(1000))
