"""`python bench/settle_cost.py`: what ending a batch of successes costs, by `settle` and by
`settle_succeeded` (its case for plain successes), in PostgreSQL's CPU and in this process's.

A fresh database at the running virtualenv's schema (bench/freshdb.py). Each round enqueues
`--batch` x `--rounds` plain jobs, claims them `--batch` at a time, then ends them `--batch` at
a time as the worker's recorder would, by one of the two statements (the sides alternate, and
which goes first alternates too): `Store.settle` of `transitions.succeeded(None)` for each, or
`Store.settle_succeeded`. Reports per side the median over `--repeat` rounds of the backend's
CPU per job (its /proc schedstat, so the server must run on this machine) and this process's
(the settlements built, the statement sent, its rows read), and checks that every job ended.

Usage: python bench/settle_cost.py [--batch 15] [--rounds 200] [--repeat 6]
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import psycopg
from freshdb import fresh_database

from taskline import transitions
from taskline.store.rows import Settlement
from taskline.store.store import Claimed, Store

WORKER = "bench-settle"


def backend_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def claimed_jobs(store: Store, url: str, count: int, batch: int) -> list[list[Claimed]]:
    ids = [uuid.uuid4() for _ in range(count)]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO taskline.jobs (id, type, queue, payload, priority, status, "
                     "max_retries, timeout_s, next_run_at) SELECT i, 'bench.noop', 'default', "
                     "'{}', 0, 'queued', 3, 30, now() FROM unnest(%s::uuid[]) i", (ids,))
        conn.execute("ANALYZE taskline.jobs")
    texts = [str(i) for i in ids]
    return [store.claim_jobs(texts[n:n + batch], WORKER, 60.0)
            for n in range(0, count, batch)]


def one_round(store: Store, url: str, batch: int, rounds: int, lean: bool) -> tuple[float, float]:
    """(backend CPU, this process's CPU) per job of ending `rounds` batches on one side."""
    batches = claimed_jobs(store, url, batch * rounds, batch)
    with store._driver() as driver:  # the store's one connection (see main)
        pid = driver.info.backend_pid
    server, client = backend_cpu_s(pid), time.thread_time()
    ended = 0
    for claims in batches:
        if lean:
            rows = store.settle_succeeded([(c.lease_id, None) for c in claims], WORKER)
        else:
            rows = store.settle([Settlement(c.lease_id, WORKER, transitions.succeeded(None))
                                 for c in claims])
        ended += len(rows)
    server, client = backend_cpu_s(pid) - server, time.thread_time() - client
    jobs = batch * rounds
    assert ended == jobs, f"{ended} of {jobs} ended"
    return server / jobs * 1e6, client / jobs * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=6)
    args = parser.parse_args()
    url = fresh_database("taskline_bench_settle")
    # One connection, so every statement runs on the backend whose CPU is read.
    store = Store.connect(url, pool_size=1, max_overflow=0, generic_plans=True)
    try:
        sides: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for n in range(args.repeat):
            for lean in (False, True) if n % 2 == 0 else (True, False):
                sides[lean].append(one_round(store, url, args.batch, args.rounds, lean))
    finally:
        store.dispose()
    for lean, name in ((False, "settle"), (True, "settle_succeeded")):
        server = statistics.median(s for s, _ in sides[lean])
        client = statistics.median(c for _, c in sides[lean])
        print(f"{name:17s} PostgreSQL {server:7.1f} us/job   this process {client:6.1f} us/job")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
