"""Handlers the benchmark registers in its workers (TASKLINE_HANDLERS=benchjobs).

`bench.stamp` returns the wall-clock instant its handler started, so pickup latency can be
measured from the API's 201 (seen by the client) to the handler's start on the same host clock.
`bench.noop` does nothing; `bench.fail` raises, for the mixed run's failing jobs.
`bench.redis` makes one Redis round trip and `bench.sleep10` waits 10 ms: the I/O-bound drains
(`bench.sleep10_async` awaits 10 ms on the worker's event loop, the `async def` drain, and
`bench.redis_async` awaits its round trip there),
(`bench.sleep` waits `payload["s"]` seconds: the flow-limit scenarios' jobs of a known length),
with the job bodies the peers run too (iojobs.py). The worker gets the benchmark's Redis URL as
REDIS_URL (bench/stack.py, Stack.env).
With BENCH_DECLARED=1, `bench.noop` and `bench.stamp` are declared types (`payload=Empty`, a
dataclass `{}` fits): the worker validates each payload and the API checks it against the
recorded schema (bench/declare.py records it at each reset), so bench/pairs.py's
`--after-env BENCH_DECLARED=1` measures declared types against undeclared ones.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import iojobs

from taskline.handlers.registry import JobContext, handler


@dataclass
class Empty:
    """The declared payload of the no-op jobs: the `{}` they are sent with fits it."""

    note: str = ""


DECLARED: dict[str, Any] = {"payload": Empty} if os.environ.get("BENCH_DECLARED") == "1" else {}


@handler("bench.stamp", **DECLARED)
def stamp(payload: Any, ctx: JobContext) -> dict[str, float]:
    return {"started": time.time()}


@handler("bench.noop", **DECLARED)
def noop(payload: Any, ctx: JobContext) -> None:
    return None


@handler("bench.fail")
def fail(payload: Any, ctx: JobContext) -> None:
    raise RuntimeError("a deliberate benchmark failure")


@handler("bench.redis")
def redis_round_trip(payload: Any, ctx: JobContext) -> None:
    iojobs.redis_round_trip(os.environ["REDIS_URL"])


@handler("bench.sleep10")
def sleep10(payload: Any, ctx: JobContext) -> None:
    iojobs.sleep10()


@handler("bench.sleep10_async")
async def sleep10_async(payload: Any, ctx: JobContext) -> None:
    await iojobs.asleep10()


@handler("bench.redis_async")
async def redis_async(payload: Any, ctx: JobContext) -> None:
    await iojobs.aredis_round_trip(os.environ["REDIS_URL"])


@handler("bench.sleep")
def sleep(payload: Any, ctx: JobContext) -> None:
    time.sleep(float(payload.get("s", 0.1)))
