"""The producer's ways in, measured on the real stack: the library's in-transaction enqueue
(`taskline.enqueue` on an autocommit psycopg connection, and `taskline.aenqueue` on an async
one) and its bulk `taskline.enqueue_many`, the Python `Client`, single and bulk, and the enqueue
call to handler start through each; beside pgqueuer in bench/run.py's `producers_side_by_side`.
`library_enqueue` alone: the library's two, with their CPU per call, for bench/pairs.py.

Invariant: as in bench/clients.py, every producer is its own process, connected and warmed up
before the clock starts, and the clock stops when the last one is done. Maintenance runs
during every library measurement (its outbox relay is the library path's way to Redis, and its
CPU is part of that path's cost). The client's CPU per enqueue is the producer process's own
CPU time (user and system, `time.process_time`) over its timed calls, divided by their count.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import time
from collections.abc import Callable
from contextlib import ExitStack, contextmanager
from typing import Any

import psycopg
from clients import run_together
from scenarios import idle_workers, quantiles
from stack import Stack, wait_until

import taskline
from taskline.client import Client

NOOP = "bench.noop"
WARMUP = 20


@contextmanager
def _maintenance(stack: Stack) -> Any:
    with stack.process("maintenance"):
        wait_until(lambda: stack.sql("SELECT count(*) FROM taskline.leader_leases "
                                     "WHERE leased_until > now()")[0][0] > 0, timeout=60)
        yield


# --- single and bulk enqueue ------------------------------------------------------------------

def _timed_calls(url: str, call: Callable[[psycopg.Connection], object], warmup: int,
                 calls: int, cpu: Any, go: Any, ready: Any) -> None:
    """`call` `warmup` times, then `calls` times once `go` is set, on one autocommit connection
    (each call's statement committed by itself); the producer's CPU per timed call on `cpu`."""
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(warmup):
            call(conn)
        ready.put(True)
        go.wait()
        started = time.process_time()
        for _ in range(calls):
            call(conn)
        cpu.put((time.process_time() - started) / calls)


def _library_producer(url: str, calls: int, cpu: Any, go: Any, ready: Any,
                      done: Any) -> None:
    _timed_calls(url, lambda conn: taskline.enqueue(conn, NOOP), WARMUP, calls, cpu, go, ready)
    done.put(calls)


def _library(stack: Stack, producer: Any, jobs: int) -> tuple[float, float]:
    """(jobs/s, the producer's CPU per call in us) of one process running `producer`."""
    stack.reset()
    cpu = mp.get_context("fork").Queue()
    with _maintenance(stack):
        seconds, finished = run_together(producer, (stack.url, jobs, cpu), 1)
    return finished / seconds, 1e6 * cpu.get(timeout=10)


def _async_library_producer(url: str, calls: int, cpu: Any, go: Any, ready: Any,
                            done: Any) -> None:
    """`taskline.aenqueue` on a psycopg AsyncConnection, autocommit: the sync path's
    statement through the async driver."""
    async def enqueue_all() -> None:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            for _ in range(WARMUP):
                await taskline.aenqueue(conn, NOOP)
            ready.put(True)
            go.wait()  # blocks the loop before the clock starts: nothing else runs on it
            started = time.process_time()
            for _ in range(calls):
                await taskline.aenqueue(conn, NOOP)
            cpu.put((time.process_time() - started) / calls)

    asyncio.run(enqueue_all())
    done.put(calls)


def library_enqueue(stack: Stack, jobs: int) -> dict[str, float]:
    """`taskline.enqueue` and `taskline.aenqueue` one after the other, each one process
    enqueueing `jobs` jobs one per call: jobs/s and the producer's CPU per call (us), what
    bench/pairs.py compares across two checkouts (the async one only where it exists)."""
    rate, cpu = _library(stack, _library_producer, jobs)
    out = {"sync_jobs_per_s": rate, "sync_cpu_us": cpu}
    if hasattr(taskline, "aenqueue"):
        rate, cpu = _library(stack, _async_library_producer, jobs)
        out.update({"async_jobs_per_s": rate, "async_cpu_us": cpu})
    return out


def _library_bulk_producer(url: str, calls: int, batch: int, cpu: Any, go: Any, ready: Any,
                           done: Any) -> None:
    """`taskline.enqueue_many` of `batch` no-op jobs a call, as pgqueuer's bulk is measured."""
    jobs = [{"type": NOOP}] * batch
    _timed_calls(url, lambda conn: taskline.enqueue_many(conn, jobs), 1, calls, cpu, go, ready)
    done.put(calls * batch)


def library_bulk(stack: Stack, jobs: int, batch: int = 1000, producers: int = 2,
                 ) -> dict[str, float]:
    """Jobs/s of `producers` processes calling `taskline.enqueue_many` in calls of `batch`,
    maintenance relaying them to Redis meanwhile, and the producer's CPU per job (us)."""
    stack.reset()
    cpu = mp.get_context("fork").Queue()
    calls = jobs // batch // producers
    with _maintenance(stack):
        seconds, finished = run_together(_library_bulk_producer, (stack.url, calls, batch, cpu),
                                         producers)
    per_call = [cpu.get(timeout=10) for _ in range(producers)]
    return {"jobs_per_s": finished / seconds, "cpu_us_per_job": 1e6 * sum(per_call)
            / len(per_call) / batch}


def _client_producer(base: str, calls: int, batch: int, cpu: Any, go: Any, ready: Any,
                     done: Any) -> None:
    with Client(base, attempts=1) as client:
        jobs = [{"type": NOOP}] * batch

        def once() -> None:
            if batch == 1:
                client.enqueue(NOOP)
            else:
                client.enqueue_batch(jobs, keyed=False)

        for _ in range(WARMUP if batch == 1 else 1):
            once()
        ready.put(True)
        go.wait()
        started = time.process_time()
        for _ in range(calls):
            once()
        cpu.put((time.process_time() - started) / calls)
    done.put(calls * batch)


def client_enqueue(stack: Stack, jobs: int, batch: int = 1, producers: int = 1,
                   ) -> dict[str, float]:
    """Jobs/s of `producers` processes calling `Client.enqueue` (batch 1) or
    `Client.enqueue_batch(keyed=False)` in calls of `batch`, and the client CPU per call, ms."""
    stack.reset()
    cpu = mp.get_context("fork").Queue()
    calls = jobs // batch // producers
    with stack.api() as base:
        seconds, finished = run_together(_client_producer, (base, calls, batch, cpu), producers)
    per_call = [cpu.get(timeout=10) for _ in range(producers)]
    return {"jobs_per_s": finished / seconds,
            "client_cpu_ms_per_call": 1000 * sum(per_call) / len(per_call)}


# --- enqueue call to handler start ----------------------------------------------------------

def _stamps(stack: Stack, sent: dict[str, float]) -> dict[str, float]:
    wait_until(lambda: stack.count("succeeded") >= len(sent), timeout=60)
    rows = stack.sql("SELECT id::text, (result->>'started')::float8 FROM taskline.jobs")
    return quantiles([(started - sent[job_id]) * 1000 for job_id, started in rows])


def library_pickup(stack: Stack, jobs: int = 300, spacing_s: float = 0.02) -> dict[str, float]:
    """ms from the `taskline.enqueue` call (autocommit: the commit is inside it) to the start
    of the handler of one idle worker; the relay of a running maintenance pushes the id."""
    stack.reset()
    sent: dict[str, float] = {}
    with ExitStack() as running:
        running.enter_context(_maintenance(stack))
        running.enter_context(stack.workers(1, 4))
        idle_workers(stack, 1)
        with psycopg.connect(stack.url, autocommit=True) as conn:
            for _ in range(jobs):
                t0 = time.time()
                sent[str(taskline.enqueue(conn, "bench.stamp"))] = t0
                time.sleep(spacing_s)
        return _stamps(stack, sent)


def client_pickup(stack: Stack, jobs: int = 300, spacing_s: float = 0.02) -> dict[str, float]:
    """ms from the `Client.enqueue` call to the start of the handler of one idle worker."""
    stack.reset()
    sent: dict[str, float] = {}
    with stack.api() as base, stack.workers(1, 4), Client(base, attempts=1) as client:
        idle_workers(stack, 1)
        for _ in range(jobs):
            t0 = time.time()
            sent[client.enqueue("bench.stamp")["id"]] = t0
            time.sleep(spacing_s)
        return _stamps(stack, sent)


# --- beside pgqueuer -------------------------------------------------------------------------

def side_by_side_once(stack: Stack, jobs: int, peers: Any | None) -> dict[str, float]:
    """One repetition of every producer path, then pgqueuer's counterparts (`peers`: the
    bench/peers.py module, None without pgqueuer): name -> figure."""
    single, bulk = min(jobs, 2000), max(jobs, 2000)
    client = client_enqueue(stack, single)
    library = library_enqueue(stack, single)
    out = {"library_single_jobs_per_s": library["sync_jobs_per_s"],
           "library_cpu_us_per_enqueue": library["sync_cpu_us"],
           "library_async_single_jobs_per_s": library["async_jobs_per_s"],
           "library_cpu_us_per_aenqueue": library["async_cpu_us"],
           "client_single_jobs_per_s": client["jobs_per_s"],
           "client_cpu_ms_per_enqueue": client["client_cpu_ms_per_call"],
           "client_bulk_jobs_per_s": client_enqueue(stack, bulk, 1000, 2)["jobs_per_s"],
           "library_bulk_jobs_per_s": library_bulk(stack, bulk)["jobs_per_s"],
           "library_pickup_p50_ms": library_pickup(stack)["p50"],
           "client_pickup_p50_ms": client_pickup(stack)["p50"]}
    if peers is not None:
        calls = peers.pgqueuer_pickup(stack)
        out.update({
            "pgqueuer_single_jobs_per_s": peers.pgqueuer_enqueue(stack, single, 1, 1),
            "pgqueuer_bulk_jobs_per_s": peers.pgqueuer_enqueue(stack, bulk, 1000, 2),
            "pgqueuer_pickup_p50_ms": quantiles([(s - t0) * 1000 for t0, _, s in calls])["p50"]})
        out.update({
            "ratio_library_single_over_pgqueuer": out["library_single_jobs_per_s"]
            / out["pgqueuer_single_jobs_per_s"],
            "ratio_client_single_over_pgqueuer": out["client_single_jobs_per_s"]
            / out["pgqueuer_single_jobs_per_s"],
            "ratio_client_bulk_over_pgqueuer": out["client_bulk_jobs_per_s"]
            / out["pgqueuer_bulk_jobs_per_s"],
            "ratio_library_bulk_over_pgqueuer": out["library_bulk_jobs_per_s"]
            / out["pgqueuer_bulk_jobs_per_s"]})
    return out
