"""The I/O the benchmark's handlers do, shared by taskline's handlers (benchjobs.py) and the
Celery and Dramatiq peers', so every system runs the very same job body.

`redis_round_trip` is one INCR of COUNTER in the benchmark's Redis logical DB (a real job makes
at least one network call; the count also proves every job ran); `sleep10` waits 10 ms without
CPU (an I/O-bound job: a slow API or query), `asleep10` and `aredis_round_trip` the same
awaited, for `async def` handlers. Each process makes one Redis client, lazily, on its
first job: after any fork, and shared by its handler threads (redis-py's pool is thread-safe).
"""

from __future__ import annotations

import asyncio
import threading
import time

import redis
import redis.asyncio as aioredis

COUNTER = "bench:io:count"
SLEEP_S = 0.01

_client: redis.Redis | None = None
_lock = threading.Lock()
_async_clients: dict[asyncio.AbstractEventLoop, aioredis.Redis] = {}


def _redis(url: str) -> redis.Redis:
    global _client
    with _lock:  # the first jobs of a process arrive on several threads at once
        if _client is None:
            _client = redis.Redis.from_url(url)
        return _client


def redis_round_trip(url: str) -> None:
    (_client or _redis(url)).incr(COUNTER)


def sleep10() -> None:
    time.sleep(SLEEP_S)


async def asleep10() -> None:
    await asyncio.sleep(SLEEP_S)


async def aredis_round_trip(url: str) -> None:
    """`redis_round_trip` awaited through redis.asyncio. An asyncio client belongs to the loop
    that made it, so each loop (a worker process has one) gets its own."""
    loop = asyncio.get_running_loop()
    client = _async_clients.get(loop)
    if client is None:
        client = _async_clients[loop] = aioredis.Redis.from_url(url)
    await client.incr(COUNTER)
