"""Handlers the fault suite runs inside real workers (TASKLINE_HANDLERS=tests.faults.faulthandlers).

Invariant: every execution leaves a row in `fault_exec_log` (job, attempt, worker, pid, start and
end in PostgreSQL's `clock_timestamp()`), written on a connection of its own that bypasses any
nemesis proxy, so the instrument sees what ran even when the worker's own links are faulted; and
every success writes one `fault_effects` row through `ctx.on_complete`, i.e. inside the fenced
completion transaction. A committed effect therefore exists if and only if that attempt's
success was recorded: two effect rows for one job is a duplicated side effect.

Types:
- `fault.work`: sleep `sleep_s` (cut short by the stop flag) and burn `cpu_ms`; fails while the
  job has had fewer than `fail_executions` earlier executions (counted in the log, so it holds
  across a dead job's requeue), or on attempts 1..`fail_first`; `non_retryable` makes the
  failure permanent. A debounce arrival's payload (`arrival`) makes it return `ctx.coalesced`,
  so the checker sees what the one run covered. `snooze_executions` snoozes
  (`taskline.Snooze(snooze_s)`) while the job has had fewer earlier executions than that,
  before anything else.
- `fault.kill_worker`: SIGKILLs its own worker process (a poison job).
- `fault.hang`: never returns and ignores the stop flag.
- `fault.work_async`, `fault.hang_async`, `fault.crash_before_commit_async`: `fault.work`,
  `fault.hang` and `fault.crash_before_commit` as `async def` handlers,
  run on the worker's event loop (the hanging one swallows every cancellation); their log
  writes go through `asyncio.to_thread`, as a coroutine's blocking calls should.
- `fault.crash_before_commit`: succeeds, but on attempt 1 its completion hook SIGKILLs the
  process inside the completion transaction, after the handler and before the commit.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from typing import Any

import psycopg
from sqlalchemy import text

from taskline.errors import JobCancelled, NonRetryableError
from taskline.handlers.registry import JobContext, handler

LOG_URL_ENV = "FAULT_LOG_DATABASE_URL"
CONNECT_TIMEOUT_S = 3
LOG_TRIES = 3

SCHEMA = """
CREATE TABLE IF NOT EXISTS fault_exec_log (
    id bigserial PRIMARY KEY,
    job_id uuid NOT NULL,
    attempt int NOT NULL,
    worker_id text NOT NULL,
    pid int NOT NULL,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended_at timestamptz,
    ending text
);
CREATE INDEX IF NOT EXISTS fault_exec_log_job ON fault_exec_log (job_id);
CREATE TABLE IF NOT EXISTS fault_effects (
    id bigserial PRIMARY KEY,
    job_id uuid NOT NULL,
    attempt int NOT NULL,
    worker_id text NOT NULL,
    committed_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS fault_effects_job ON fault_effects (job_id);
"""
# No unique constraint on fault_effects: a duplicate must be recorded so the checker sees it.

_local = threading.local()


def create_tables(database_url: str) -> None:
    """Create the execution log and the effects table (the suite does this per cluster)."""
    with psycopg.connect(database_url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as c:
        c.execute(SCHEMA)


def _connection() -> psycopg.Connection:
    conn = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        url = os.environ.get(LOG_URL_ENV) or os.environ["DATABASE_URL"]
        conn = psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
        _local.conn = conn
    return conn


def _log_sql(sql: str, params: tuple) -> Any:
    """Run one logging statement; reconnect and retry a few times (the server may restart)."""
    for attempt in range(LOG_TRIES):
        try:
            row = _connection().execute(sql, params).fetchone()
            return row[0] if row else None
        except psycopg.OperationalError:
            _local.conn = None
            if attempt + 1 == LOG_TRIES:
                raise
            time.sleep(0.5)
    return None


class Execution:
    """One row of fault_exec_log: opened when the handler starts, closed when it ends."""

    def __init__(self, ctx: JobContext) -> None:
        self.job_id = str(ctx.job_id)
        self.row_id = _log_sql(
            "INSERT INTO fault_exec_log (job_id, attempt, worker_id, pid) "
            "VALUES (%s, %s, %s, %s) RETURNING id",
            (self.job_id, ctx.attempt, ctx.worker_id, os.getpid()))

    def earlier(self) -> int:
        """Executions of this job that started before this one."""
        return int(_log_sql("SELECT count(*) FROM fault_exec_log WHERE job_id = %s AND id < %s",
                            (self.job_id, self.row_id)))

    def end(self, ending: str) -> None:
        _log_sql("UPDATE fault_exec_log SET ended_at = clock_timestamp(), ending = %s "
                 "WHERE id = %s RETURNING id", (ending, self.row_id))


def effect_hook(ctx: JobContext):
    """The exactly-once side effect: one row, in the completion transaction."""
    def write(conn: Any) -> None:
        conn.execute(text("INSERT INTO fault_effects (job_id, attempt, worker_id) "
                          "VALUES (:job_id, :attempt, :worker_id)"),
                     {"job_id": str(ctx.job_id), "attempt": ctx.attempt,
                      "worker_id": ctx.worker_id})
    return write


def _params(payload: Any) -> dict[str, Any]:
    return payload if isinstance(payload, dict) else {}


def _work(params: dict[str, Any], ctx: JobContext) -> None:
    sleep_s = float(params.get("sleep_s", 0) or 0)
    if sleep_s > 0:
        ctx.stop_event.wait(sleep_s)
    deadline = time.perf_counter() + float(params.get("cpu_ms", 0) or 0) / 1000
    while time.perf_counter() < deadline and not ctx.stopping:
        sum(i * i for i in range(1000))


def _should_fail(params: dict[str, Any], ctx: JobContext, execution: Execution) -> bool:
    if ctx.attempt <= int(params.get("fail_first", 0) or 0):
        return True
    wanted = int(params.get("fail_executions", 0) or 0)
    return wanted > 0 and execution.earlier() < wanted


@handler("fault.work")
def work(payload: Any, ctx: JobContext) -> dict[str, Any]:
    params = _params(payload)
    execution = Execution(ctx)
    try:
        snoozes = int(params.get("snooze_executions", 0) or 0)
        if snoozes > 0 and execution.earlier() < snoozes:
            # Imported here: an earlier release's worker imports this module too
            # (tests/integration/test_schema_move.py), and it has no Snooze.
            from taskline.errors import Snooze

            raise Snooze(float(params.get("snooze_s", 0) or 0))
        _work(params, ctx)
        if ctx.stopping:
            raise JobCancelled("stopped before the work finished")
        if _should_fail(params, ctx, execution):
            error = NonRetryableError if params.get("non_retryable") else RuntimeError
            raise error("fault.work failed on purpose")
    except BaseException as err:
        execution.end(f"raised {type(err).__name__}")
        raise
    ctx.on_complete(effect_hook(ctx))
    execution.end("returned")
    if "arrival" in params:  # a debounce arrival: the run reports every payload it covered
        return {"attempt": ctx.attempt, "coalesced": ctx.coalesced}
    return {"attempt": ctx.attempt}


@handler("fault.kill_worker")
def kill_worker(payload: Any, ctx: JobContext) -> None:
    Execution(ctx)
    os.kill(os.getpid(), signal.SIGKILL)


@handler("fault.hang")
def hang(payload: Any, ctx: JobContext) -> None:
    Execution(ctx)
    while True:  # deliberately deaf to ctx.stopping: only the timeout can end this attempt
        time.sleep(3600)


@handler("fault.crash_before_commit")
def crash_before_commit(payload: Any, ctx: JobContext) -> dict[str, Any]:
    execution = Execution(ctx)
    write = effect_hook(ctx)

    def commit_or_crash(conn: Any) -> None:
        write(conn)
        if ctx.attempt == 1:
            # The effect row and the completion are written but not committed: dying here
            # must roll both back.
            os.kill(os.getpid(), signal.SIGKILL)

    ctx.on_complete(commit_or_crash)
    execution.end("returned")
    return {"attempt": ctx.attempt}


async def _work_async(params: dict[str, Any], ctx: JobContext) -> None:
    sleep_s = float(params.get("sleep_s", 0) or 0)
    until = time.monotonic() + sleep_s
    while not ctx.stopping and time.monotonic() < until:
        await asyncio.sleep(min(0.02, max(until - time.monotonic(), 0)))
    deadline = time.perf_counter() + float(params.get("cpu_ms", 0) or 0) / 1000
    while time.perf_counter() < deadline and not ctx.stopping:
        sum(i * i for i in range(1000))


@handler("fault.work_async")
async def work_async(payload: Any, ctx: JobContext) -> dict[str, Any]:
    params = _params(payload)
    execution = await asyncio.to_thread(Execution, ctx)
    try:
        await _work_async(params, ctx)
        if ctx.stopping:
            raise JobCancelled("stopped before the work finished")
        if await asyncio.to_thread(_should_fail, params, ctx, execution):
            error = NonRetryableError if params.get("non_retryable") else RuntimeError
            raise error("fault.work_async failed on purpose")
    except BaseException as err:
        await asyncio.to_thread(execution.end, f"raised {type(err).__name__}")
        raise
    ctx.on_complete(effect_hook(ctx))
    await asyncio.to_thread(execution.end, "returned")
    return {"attempt": ctx.attempt}


@handler("fault.hang_async")
async def hang_async(payload: Any, ctx: JobContext) -> None:
    await asyncio.to_thread(Execution, ctx)
    while True:  # deaf to ctx.stopping and to cancellation: written off at its timeout
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            continue


@handler("fault.crash_before_commit_async")
async def crash_before_commit_async(payload: Any, ctx: JobContext) -> dict[str, Any]:
    execution = await asyncio.to_thread(Execution, ctx)
    write = effect_hook(ctx)

    def commit_or_crash(conn: Any) -> None:
        write(conn)
        if ctx.attempt == 1:
            os.kill(os.getpid(), signal.SIGKILL)  # as fault.crash_before_commit

    ctx.on_complete(commit_or_crash)
    await asyncio.to_thread(execution.end, "returned")
    return {"attempt": ctx.attempt}
