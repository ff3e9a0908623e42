"""The pgqueuer side of the side-by-side runs: its consumer factory, handlers and producers, on
a database of the benchmark's PostgreSQL (the same server, fsync on, as taskline's).

pgqueuer is the durable PostgreSQL queue among the peers, so it is set up as its documentation
says for throughput: the schema from `pgq install` at its default durability (`durable`: logged
tables, nothing lost in a crash, as taskline), the asyncpg driver (its benchmark page: ~1.7x
psycopg) and one direct connection per consumer (its performance guide: a pool loses LISTEN).
Consumers are `python peer_pgqueuer.py SLOTS` processes: the `main` factory run through
`PgQueuer.run(batch_size=..., max_concurrent_tasks=...)`, pgqueuer's documented Python API,
because `pgq run` of pgqueuer 1.6.0 fails at start with typer 0.29 (its `--log-level` option
reaches the logging setup as a string). pgqueuer runs only `async def`
entrypoints, so the handlers are the asyncio forms of taskline's (bench/iojobs.py): one INCR of
the same counter through redis.asyncio (one client per process, made on the first job) and
`asyncio.sleep(0.01)`; neither needs a thread, the cheapest form pgqueuer offers.
Producers are forked processes with one autocommit asyncpg connection each, connected and
warmed up before the clock starts, like the HTTP clients of taskline's scenarios.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import redis.asyncio as aioredis
from clients import run_together
from iojobs import COUNTER, SLEEP_S
from pgqueuer import PgQueuer
from pgqueuer.models import Job
from pgqueuer.queries import Queries

DSN_ENV = "BENCH_PGQ_DSN"
STAMPS = "bench:pgq:stamps"  # Redis list: "<seq> <handler start, epoch s>" per stamp job

_redis: aioredis.Redis | None = None


def _client() -> aioredis.Redis:
    global _redis
    if _redis is None:  # one event loop per process: no lock needed
        _redis = aioredis.Redis.from_url(os.environ.get("BENCH_REDIS_URL",
                                                        "redis://127.0.0.1:6379/9"))
    return _redis


async def noop(job: Job) -> None:
    return None


async def redis_round_trip(job: Job) -> None:
    await _client().incr(COUNTER)


async def sleep10(job: Job) -> None:
    await asyncio.sleep(SLEEP_S)


async def stamp(job: Job) -> None:
    started = time.time()
    await _client().rpush(STAMPS, f"{(job.payload or b'').decode()} {started}")


ENTRYPOINTS: dict[str, Callable[[Job], Awaitable[None]]] = {
    "noop": noop, "redis": redis_round_trip, "sleep10": sleep10, "stamp": stamp}


@asynccontextmanager
async def main() -> AsyncIterator[PgQueuer]:
    """A `pgq run` factory: every benchmark entrypoint, without a concurrency_limit (that
    limit is global across all consumers; the per-process one is max_concurrent_tasks)."""
    connection = await asyncpg.connect(dsn=os.environ[DSN_ENV])
    pgq = PgQueuer.from_asyncpg_connection(connection)
    for name, fn in ENTRYPOINTS.items():
        pgq.entrypoint(name)(fn)
    try:
        yield pgq
    finally:
        await connection.close()


async def consume(slots: int) -> None:
    """One consumer: at most `slots` jobs at a time, fetched `slots` / 2 per dequeue (the
    largest batch pgqueuer allows under that cap), or with 0 pgqueuer's defaults (batches of
    10, no cap); SIGTERM stops it as `pgq run` would."""
    settings = {"batch_size": max(1, slots // 2), "max_concurrent_tasks": slots} if slots else {}
    async with main() as pgq:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, pgq.shutdown.set)
        await pgq.run(**settings)


# --- producers -------------------------------------------------------------------------------

async def _enqueue(queries: Queries, entrypoint: str, batch: int) -> None:
    if batch == 1:  # the single-job form: one INSERT per call, autocommit
        await queries.enqueue(entrypoint, None)
    else:
        await queries.enqueue([entrypoint] * batch, [None] * batch, [0] * batch)


async def _produce(dsn: str, entrypoint: str, batch: int, calls: int, warmup: int,
                   go: Any, ready: Any) -> None:
    connection = await asyncpg.connect(dsn=dsn)
    queries = Queries.from_asyncpg_connection(connection)
    for _ in range(warmup):  # connect, and prepare the statements, before the clock starts
        await _enqueue(queries, entrypoint, batch)
    ready.put(True)
    await asyncio.to_thread(go.wait)
    for _ in range(calls):
        await _enqueue(queries, entrypoint, batch)
    await connection.close()


def _producer(dsn: str, entrypoint: str, batch: int, calls: int, warmup: int, go: Any,
              ready: Any, done: Any) -> None:
    asyncio.run(_produce(dsn, entrypoint, batch, calls, warmup, go, ready))
    done.put(calls)


def produce(dsn: str, jobs: int, batch: int = 1, producers: int = 1, warmup: int = 0,
            entrypoint: str = "noop") -> float:
    """Seconds for `producers` processes to enqueue `jobs` jobs in calls of `batch`; each first
    makes `warmup` calls that are not timed (their jobs stay in the queue)."""
    calls = jobs // batch // producers
    elapsed, finished = run_together(_producer, (dsn, entrypoint, batch, calls, warmup),
                                     producers)
    if finished != calls * producers:
        raise RuntimeError("a pgqueuer producer stopped early")
    return elapsed


async def _paced(dsn: str, jobs: int, spacing_s: float) -> dict[str, tuple[float, float]]:
    connection = await asyncpg.connect(dsn=dsn)
    queries = Queries.from_asyncpg_connection(connection)
    times: dict[str, tuple[float, float]] = {}
    for seq in range(jobs):
        t0 = time.time()
        await queries.enqueue("stamp", str(seq).encode())
        times[str(seq)] = (t0, time.time())
        await asyncio.sleep(spacing_s)
    await connection.close()
    return times


def paced(dsn: str, jobs: int, spacing_s: float) -> dict[str, tuple[float, float]]:
    """Single `stamp` enqueues `spacing_s` apart: seq -> (call made, call returned), epoch s."""
    return asyncio.run(_paced(dsn, jobs, spacing_s))


if __name__ == "__main__":
    asyncio.run(consume(int(sys.argv[1])))
