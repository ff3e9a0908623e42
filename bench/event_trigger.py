"""What the event stream costs the write path: the job_events NOTIFY trigger on and off.

Against a fresh, migrated database (PostgreSQL as the server is configured, fsync included),
with one LISTEN connection draining the channel as an API process would, it times the Store
calls the producer and the worker make with the trigger enabled and disabled (ALTER TABLE ...
DISABLE TRIGGER), in many short rounds whose order alternates, so background load on a shared
machine hits both sides alike. Per scenario it prints the median time per job on each side and
the median of the per-round ratios:

- batch enqueue: 2,000 jobs per round as transactions of insert_jobs + insert_events of 1,000
  jobs each, the shape of POST /api/v1/jobs/batch;
- single enqueue: 200 transactions of one job each (POST /api/v1/jobs), from 1 and 4 threads
  (PostgreSQL serializes the commits of transactions that NOTIFY);
- claim + complete: 1,000 queued jobs claimed and completed 50 at a time (the worker's path).

Usage: python bench/event_trigger.py [--rounds N]
Environment: BENCH_ADMIN_URL (PostgreSQL admin URL, default postgresql://root@127.0.0.1/postgres).
The database taskline_bench_events is dropped and created.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql
from sqlalchemy import text

from taskline.store.listener import Listener
from taskline.store.migrate import upgrade
from taskline.store.store import Store

ADMIN_URL = os.environ.get("BENCH_ADMIN_URL", "postgresql://root@127.0.0.1:5432/postgres")
DB_NAME = "taskline_bench_events"
WORKER = "bench-worker"


def db_url(name: str) -> str:
    return urlunsplit(urlsplit(ADMIN_URL)._replace(path="/" + name))


def job_row() -> dict:
    return {"id": uuid.uuid4(), "type": "simulate", "queue": "default", "payload": {"n": 1},
            "priority": 5, "status": "queued", "max_retries": 3, "timeout_s": 30.0,
            "idempotency_key": None, "request_hash": None}


def enqueue(store: Store, count: int) -> list[uuid.UUID]:
    with store.transaction() as conn:
        jobs = store.insert_jobs(conn, [job_row() for _ in range(count)])
        store.insert_events(conn, [j.id for j in jobs], "enqueued")
    return [j.id for j in jobs]


def batch_enqueue(store: Store) -> Scenario:
    def run() -> None:
        for _ in range(2):
            enqueue(store, 1000)
    return Scenario(run, 2000)


def single_enqueue(store: Store, threads: int) -> Scenario:
    def run() -> None:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda _: enqueue(store, 1), range(200 * threads)))
    return Scenario(run, 200 * threads)


def claim_complete(store: Store) -> Scenario:
    ids = [i for _ in range(1) for i in enqueue(store, 1000)]  # set up outside the timing

    def run() -> None:
        for at in range(0, len(ids), 50):
            claimed = store.claim_jobs(ids[at:at + 50], WORKER, lease_s=60)
            store.complete_jobs([(c.lease_id, None) for c in claimed], WORKER)
    return Scenario(run, len(ids))


@dataclass
class Scenario:
    run: Callable[[], None]
    jobs: int


class Drain:
    """One LISTEN connection reading every notification, as an API process does."""

    def __init__(self, url: str) -> None:
        self.listener = Listener(url)
        self.listener.open()
        self.count = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            for _ in self.listener.payloads(0.2):
                self.count += 1

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.listener.close()


def set_trigger(store: Store, enabled: bool) -> None:
    verb = "ENABLE" if enabled else "DISABLE"
    with store.transaction() as conn:
        conn.execute(text(f"ALTER TABLE job_events {verb} TRIGGER job_events_notify"))


def per_job_ms(store: Store, make: Callable[[Store], Scenario], enabled: bool) -> float:
    scenario = make(store)  # set-up (claim + complete enqueues first) is not timed
    set_trigger(store, enabled)
    started = time.perf_counter()
    scenario.run()
    return (time.perf_counter() - started) * 1000 / scenario.jobs


def trigger_us_per_event(store: Store, events: int, samples: int = 7) -> float:
    """The trigger's own time per event as PostgreSQL measures it (EXPLAIN ANALYZE), median."""
    set_trigger(store, True)
    times = []
    for _ in range(samples):
        ids = [str(i) for i in enqueue(store, events)]
        with store.transaction() as conn:
            plan = conn.execute(text(
                "EXPLAIN (ANALYZE, FORMAT JSON) INSERT INTO job_events (job_id, attempt, event) "
                "SELECT unnest(CAST(:ids AS uuid[])), 0, 'promoted'"), {"ids": ids}).scalar_one()
        [trigger] = [t for t in plan[0]["Triggers"] if t["Trigger Name"] == "job_events_notify"]
        times.append(trigger["Time"] * 1000 / events)
    return statistics.median(times)


SCENARIOS: dict[str, Callable[[Store], Scenario]] = {
    "batch enqueue (1,000 per transaction)": batch_enqueue,
    "single enqueue, 1 thread": lambda store: single_enqueue(store, 1),
    "single enqueue, 4 threads": lambda store: single_enqueue(store, 4),
    "claim + complete (50 per statement)": claim_complete,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    rounds = parser.parse_args().rounds
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
                      .format(sql.Identifier(DB_NAME)))
    url = db_url(DB_NAME)
    upgrade(url)
    store = Store.connect(url, pool_size=5)
    drain = Drain(url)
    print(f"median of {rounds} rounds; time per job in ms")
    print(f"{'scenario':40} {'trigger on':>10} {'off':>8} {'cost':>7}")
    for name, make in SCENARIOS.items():
        on, off, ratios = [], [], []
        for round_ in range(rounds):
            order = (True, False) if round_ % 2 == 0 else (False, True)
            times = {enabled: per_job_ms(store, make, enabled) for enabled in order}
            on.append(times[True])
            off.append(times[False])
            ratios.append(times[True] / times[False])
        print(f"{name:40} {statistics.median(on):10.3f} {statistics.median(off):8.3f} "
              f"{100 * (statistics.median(ratios) - 1):+6.1f}%")
    for events in (1, 50, 1000):
        print(f"trigger time inside PostgreSQL, {events:>4} events per statement: "
              f"{trigger_us_per_event(store, events):6.1f} us per event")
    drain.close()
    store.dispose()
    print(f"notifications heard by the listener: {drain.count}")


if __name__ == "__main__":
    main()
