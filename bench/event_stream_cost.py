"""What the event stream costs the write path: tailing job_events versus a NOTIFY trigger.

The API streams job events by tailing job_events (services/producer/operations/broadcaster.py):
nothing is added to any transaction, each API process with an open stream reads the table a few
times a second. The design that was measured against it, and rejected, is a statement-level trigger
on
job_events calling pg_notify (NOTIFY_SQL below, created here only), with a LISTEN connection per
API process. This script times the Store calls producers and workers make under three variants:

- none:   nothing reads the events;
- tail:   two tail readers, each in a process of its own like two API processes with streams
          open, polling every 0.25 s;
- notify: the NOTIFY trigger installed and one LISTEN connection draining it.

Scenarios (time per job): batch enqueue (insert_jobs_with_events, 1,000 jobs per
statement, as POST /api/v1/jobs/batch), single enqueue (one job per transaction, as
POST /api/v1/jobs) from 1 and from 8 threads, claim + complete 50 jobs per statement (the
worker's path). Short rounds alternate the variants' order, so the background load of a shared
machine hits each alike; medians are printed.

Usage: python bench/event_stream_cost.py [--rounds N]
Environment: BENCH_ADMIN_URL (PostgreSQL admin URL, default postgresql://root@127.0.0.1/postgres).
The database taskline_bench_events is dropped and created.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql
from sqlalchemy import text

from taskline import transitions
from taskline.events import Sequencer
from taskline.jobs import new_job_id
from taskline.store.migrate import upgrade
from taskline.store.rows import Settlement
from taskline.store.store import Store

ADMIN_URL = os.environ.get("BENCH_ADMIN_URL", "postgresql://root@127.0.0.1:5432/postgres")
DB_NAME = "taskline_bench_events"
WORKER = "bench-worker"

NOTIFY_SQL = """
CREATE OR REPLACE FUNCTION bench_notify_job_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('taskline_events', s.payload)
    FROM (SELECT json_build_object('id', e.id, 'job_id', e.job_id, 'attempt', e.attempt,
                                   'event', e.event, 'worker_id', e.worker_id,
                                   'created_at', e.created_at, 'queue', j.queue,
                                   'type', j.type, 'priority', j.priority)::text AS payload
          FROM inserted e
          LEFT JOIN LATERAL (SELECT queue, type, priority FROM taskline.jobs
                             WHERE jobs.id = e.job_id OFFSET 0) j ON true
          ORDER BY e.id) s;
    RETURN NULL;
END $$;
CREATE TRIGGER bench_notify AFTER INSERT ON job_events REFERENCING NEW TABLE AS inserted
FOR EACH STATEMENT EXECUTE FUNCTION bench_notify_job_events();
"""
DROP_NOTIFY_SQL = "DROP TRIGGER IF EXISTS bench_notify ON job_events"


def db_url(name: str) -> str:
    return urlunsplit(urlsplit(ADMIN_URL)._replace(path="/" + name))


def enqueue(store: Store, count: int) -> list[uuid.UUID]:
    rows = [{"id": new_job_id(), "type": "simulate", "queue": "default", "payload": {"n": 1},
             "priority": 5, "status": "queued", "max_retries": 3, "timeout_s": 30.0,
             "run_at": None, "delay_s": 0.0, "idempotency_key": None, "request_hash": None,
             "trace_context": None} for _ in range(count)]
    return [row.id for row in store.insert_jobs_with_events(rows)]


def batch_enqueue(store: Store) -> tuple[Callable[[], None], int]:
    return (lambda: [enqueue(store, 1000) for _ in range(2)]), 2000


def single_enqueue(threads: int) -> Callable[[Store], tuple[Callable[[], None], int]]:
    def make(store: Store) -> tuple[Callable[[], None], int]:
        def run() -> None:
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(lambda _: enqueue(store, 1), range(150 * threads)))
        return run, 150 * threads
    return make


def claim_complete(store: Store) -> tuple[Callable[[], None], int]:
    ids = enqueue(store, 1000)  # set up before the clock starts

    def run() -> None:
        for at in range(0, len(ids), 50):
            claimed = store.claim_jobs(ids[at:at + 50], WORKER, lease_s=60)
            store.settle([Settlement(c.lease_id, WORKER, transitions.succeeded(None))
                          for c in claimed])
    return run, len(ids)


SCENARIOS = {"batch enqueue (1,000 per transaction)": batch_enqueue,
             "single enqueue, 1 thread": single_enqueue(1),
             "single enqueue, 8 threads": single_enqueue(8),
             "claim + complete (50 per statement)": claim_complete}


def tail(url: str, ready: Any, stop: Any, poll_s: float) -> None:
    """What an API process's tail does while a stream is open (run in a process of its own)."""
    store = Store.connect(url, pool_size=1)
    sequencer = Sequencer(store.last_event_id(), max_wait_s=5.0)
    ready.release()
    while not stop.is_set():
        rows = store.events_after(sequencer.cursor, 1000)
        released = sequencer.release([r["id"] for r in rows], store.transaction_horizon,
                                     time.monotonic())
        if len(released) < 1000:
            stop.wait(poll_s)
    store.dispose()


@contextmanager
def tails(url: str, count: int = 2, poll_s: float = 0.25) -> Iterator[None]:
    """`count` tail readers in processes of their own, as `count` API processes would be."""
    context = multiprocessing.get_context("spawn")
    stop, ready = context.Event(), context.Semaphore(0)
    readers = [context.Process(target=tail, args=(url, ready, stop, poll_s))
               for _ in range(count)]
    for reader in readers:
        reader.start()
    for _ in readers:  # started and reading before the clock starts
        ready.acquire()
    try:
        yield
    finally:
        stop.set()
        for reader in readers:
            reader.join()


@contextmanager
def notify(store: Store, url: str) -> Iterator[None]:
    """The rejected design: the NOTIFY trigger and one LISTEN connection draining it."""
    with store.transaction() as conn:
        conn.execute(text(NOTIFY_SQL))
    stop = threading.Event()
    listener = psycopg.connect(url, autocommit=True)
    listener.execute("LISTEN taskline_events")

    def drain() -> None:
        while not stop.is_set():
            for _ in listener.notifies(timeout=0.2):
                pass

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        listener.close()
        with store.transaction() as conn:
            conn.execute(text(DROP_NOTIFY_SQL))


@contextmanager
def nothing() -> Iterator[None]:
    yield


def per_job_ms(store: Store, url: str, make: Callable, variant: str) -> float:
    run, jobs = make(store)
    context = {"none": nothing, "tail": lambda: tails(url),
               "notify": lambda: notify(store, url)}[variant]
    with context():
        started = time.perf_counter()
        run()
        return (time.perf_counter() - started) * 1000 / jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    rounds = parser.parse_args().rounds
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
                      .format(sql.Identifier(DB_NAME)))
    url = db_url(DB_NAME)
    upgrade(url)
    store = Store.connect(url, pool_size=10)
    variants = ["none", "tail", "notify"]
    print(f"median of {rounds} rounds; ms per job (cost against none)")
    print(f"{'scenario':40} {'none':>8} {'tail':>16} {'notify':>16}")
    for name, make in SCENARIOS.items():
        times: dict[str, list[float]] = {v: [] for v in variants}
        for round_ in range(rounds):
            order = variants[round_ % 3:] + variants[:round_ % 3]
            for variant in order:
                times[variant].append(per_job_ms(store, url, make, variant))
        medians = {v: statistics.median(times[v]) for v in variants}
        base = medians["none"]
        cells = [f"{base:8.3f}"] + [f"{medians[v]:8.3f} {100 * (medians[v] / base - 1):+6.1f}%"
                                    for v in variants[1:]]
        print(f"{name:40} " + " ".join(cells))
    store.dispose()


if __name__ == "__main__":
    main()
