"""`async def` handlers for the worker tests of coroutine handlers (test_worker_async).

Registered by importing tests.integration.worker_handlers, which the test worker loads; they
share its gates and call records, so sync and async handlers can be mixed in one worker.
Each records the thread it ran on, so a test can tell the event loop from a pool thread.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from sqlalchemy import text

from taskline.errors import JobCancelled
from taskline.handlers.registry import JobContext, handler
from tests.integration import worker_handlers as th

THREADS: dict[str, str] = {}
"""payload tag -> the name of the thread its handler ran on."""
BLOCKING = threading.Event()
"""Set while t.async.blocking holds the event loop."""


def _ran(payload: Any) -> None:
    THREADS[str(payload.get("tag"))] = threading.current_thread().name


@handler("t.async.record")
async def record(payload: Any, ctx: JobContext) -> dict:
    """Yield to the loop once, then remember the call and succeed."""
    await asyncio.sleep(0)
    _ran(payload)
    th._record(payload, ctx)
    return {"tag": payload.get("tag"), "attempt": ctx.attempt}


@handler("t.async.fail")
async def fail(payload: Any, ctx: JobContext) -> None:
    await asyncio.sleep(0)
    raise RuntimeError(payload.get("error", "async boom"))


@handler("t.async.block")
async def block(payload: Any, ctx: JobContext) -> dict:
    """Await the gate; stop cooperatively (raise JobCancelled) when asked to."""
    gate = th.gate(payload["gate"])
    for _ in range(int(th.GATE_LIMIT_S / 0.01)):
        if gate.is_set():
            return {"released": True}
        if ctx.stopping:
            raise JobCancelled("stopped on request")
        await asyncio.sleep(0.01)
    raise TimeoutError("gate never opened")


@handler("t.async.sleep")
async def sleep(payload: Any, ctx: JobContext) -> dict:
    """Await `sleep_s`: cancellable at every await."""
    await asyncio.sleep(float(payload["sleep_s"]))
    return {"slept": payload["sleep_s"]}


@handler("t.async.stubborn")
async def stubborn(payload: Any, ctx: JobContext) -> dict:
    """Await the gate and swallow every cancellation: a handler that cannot be stopped."""
    gate = th.gate(payload["gate"])
    for _ in range(int(th.GATE_LIMIT_S / 0.01)):
        if gate.is_set():
            break
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            continue
    return {"stubborn": True}


@handler("t.async.blocking")
async def blocking(payload: Any, ctx: JobContext) -> dict:
    """Hold the event loop with a synchronous sleep of `block_s`: what no coroutine should do."""
    BLOCKING.set()
    try:
        time.sleep(float(payload["block_s"]))
    finally:
        BLOCKING.clear()
    return {"blocked_s": payload["block_s"]}


@handler("t.async.hook")
async def hook(payload: Any, ctx: JobContext) -> dict:
    """Register a hook writing to hook_log in the completion transaction."""
    statement = "SELECT 1/0" if payload.get("hook_fails") else (
        "INSERT INTO hook_log (job_id, attempt) VALUES (:job_id, :attempt)")
    ctx.on_complete(lambda conn: conn.execute(text(statement),
                                              {"job_id": ctx.job_id, "attempt": ctx.attempt}))
    await asyncio.sleep(0)
    return {"hooked": True}


@handler("t.async.held")
async def held(payload: Any, ctx: JobContext) -> dict:
    """t.held's twin: count how many handlers of any kind run at once, await `sleep_s`."""
    _ran(payload)
    th.enter(ctx.type)
    try:
        await asyncio.sleep(float(payload.get("sleep_s", 0.05)))
    finally:
        th.leave(ctx.type)
    return {"tag": payload.get("tag")}


def reset() -> None:
    THREADS.clear()
    BLOCKING.clear()
