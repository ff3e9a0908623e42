"""Enqueue rates of unique and debounced jobs, read beside the plain ones of the same run
(`enqueue_single_8_clients`, `enqueue_batch`): what the per-key lock and lookups cost.

Invariant: as in bench/clients.py, the client is not the bottleneck: each client is its own process
on one keep-alive connection, with every request body serialised before the clock starts, and all
start together (clients.run_each). The bodies differ per request (a key each), so each scenario
measures one path of taskline.uniqueness: a new unique job per request, duplicates of a few keys, or
debounce arrivals joining a few waiting jobs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from clients import Connection, run_each
from stack import Stack

KEYS = 64
"""Keys of the duplicate and debounce scenarios: after the first request of each, every
request is a duplicate (or a join), spread over as many locks."""
NOOP = {"type": "bench.noop", "payload": {}}
CLIENTS = 8
WARMUP = 20


def _client(base: str, path: str, bodies: list[bytes], warmup: int, go: Any, ready: Any,
            done: Any) -> None:
    conn = Connection(base)
    for body in bodies[:warmup]:
        conn.send(path, body)
    ready.put(True)
    go.wait()
    for body in bodies[warmup:]:
        conn.send(path, body)
    conn.close()
    done.put(len(bodies) - warmup)


def _run_each(base: str, path: str, per_client: list[list[bytes]], warmup: int) -> float:
    """Seconds for every client to post its bodies (after its `warmup` first ones)."""
    elapsed, finished = run_each(_client, [(base, path, bodies, warmup) for bodies in per_client])
    if finished != sum(len(b) - warmup for b in per_client):
        raise RuntimeError("a benchmark client stopped early")
    return elapsed


def _rate(stack: Stack, path: str, make: Callable[[int, int], dict], requests: int,
          jobs_per_request: int = 1, clients: int = CLIENTS, warmup: int = WARMUP) -> float:
    """Jobs/s of `clients` processes, client c posting `make(c, i)` as its i-th request."""
    share = requests // clients
    per_client = [[json.dumps(make(c, i), separators=(",", ":")).encode()
                   for i in range(share + warmup)] for c in range(clients)]
    stack.reset()
    with stack.api() as base:
        seconds = _run_each(base, path, per_client, warmup)
    return share * clients * jobs_per_request / seconds


def unique_new(stack: Stack, requests: int) -> float:
    """Every request a new unique job (its own key): lock, lookup, insert."""
    return _rate(stack, "/api/v1/jobs", lambda c, i: {
        **NOOP, "unique": {"key": f"u-{c}-{i}"}}, requests)


def unique_duplicates(stack: Stack, requests: int) -> float:
    """Requests over KEYS keys: after each key's first, every one a duplicate (nothing
    written)."""
    return _rate(stack, "/api/v1/jobs", lambda c, i: {
        **NOOP, "unique": {"key": f"k-{(c * 7 + i) % KEYS}"}}, requests)


def debounce_joins(stack: Stack, requests: int) -> float:
    """Arrivals over KEYS debounce groups (a minute's delay): nearly all join a waiting job
    (a new one after every 1,000 payloads)."""
    return _rate(stack, "/api/v1/jobs", lambda c, i: {
        "type": "bench.noop", "payload": {"c": c, "i": i},
        "debounce": {"key": f"d-{(c * 7 + i) % KEYS}", "delay_s": 60}}, requests)


def unique_batch(stack: Stack, jobs: int, batch: int = 1000, clients: int = 2) -> float:
    """Batches of `batch` new unique jobs (a key each), written job by job in one
    transaction: beside `enqueue_batch` (plain jobs, COPY)."""
    return _rate(stack, "/api/v1/jobs/batch", lambda c, i: {"jobs": [
        {**NOOP, "unique": {"key": f"b-{c}-{i}-{n}"}} for n in range(batch)]},
        max(jobs // batch, clients), jobs_per_request=batch, clients=clients, warmup=1)


def scenarios(n: int) -> dict[str, Callable[[Stack], Any]]:
    """Name -> one measurement (jobs/s), for bench/run.py's table."""
    single = min(n, 4000)
    return {
        "enqueue_unique_8_clients": lambda s: unique_new(s, single),
        "enqueue_unique_duplicates_8_clients": lambda s: unique_duplicates(s, single),
        "enqueue_debounce_8_clients": lambda s: debounce_joins(s, single),
        "enqueue_batch_unique": lambda s: unique_batch(s, min(n, 10_000)),
    }
