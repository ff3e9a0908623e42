"""Handlers the benchmark registers in its workers (TASKLINE_HANDLERS=benchjobs).

`bench.stamp` returns the wall-clock instant its handler started, so pickup latency can be
measured from the API's 201 (seen by the client) to the handler's start on the same host clock.
`bench.noop` does nothing; `bench.fail` raises, for the mixed run's failing jobs.
"""

from __future__ import annotations

import time
from typing import Any

from taskline.handlers.registry import JobContext, handler


@handler("bench.stamp")
def stamp(payload: Any, ctx: JobContext) -> dict[str, float]:
    return {"started": time.time()}


@handler("bench.noop")
def noop(payload: Any, ctx: JobContext) -> None:
    return None


@handler("bench.fail")
def fail(payload: Any, ctx: JobContext) -> None:
    raise RuntimeError("a deliberate benchmark failure")
