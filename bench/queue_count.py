"""What the queue limit's test costs an enqueue, by the backlog of unfinished jobs, with this
checkout's statements and, side by side, another checkout's.

A fresh database at the running virtualenv's schema holds 20,000 finished jobs in `default`;
for each `--backlogs` size it then holds that many queued jobs spread over five other queues
(ANALYZEd, as autovacuum would leave them), and one queued job in `busy`. One job at a time is
written by the API's statement (`insert_jobs_with_events`, prepared, autocommit; PostgreSQL
chooses its plan) into `default`, a queue without work, whose write counts the queues holding
unfinished jobs, and into `busy`, whose write only probes; each written job is then marked
finished (untimed), so `default` stays empty. With `--before <checkout>`, that checkout's SQL
files are loaded too and the two statements alternate by blocks of 50 (which goes first
alternates too), on one connection.

Prints per backlog and queue the median microseconds of a write (of the blocks' medians) for
each side and their ratio (before / after: above 1, faster now). Usage:
    python bench/queue_count.py [--backlogs 0,20000,200000] [--blocks 20] [--before <checkout>]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

import psycopg
from freshdb import fresh_database, url_of
from sides import in_turn, medians, sql_source
from sqlalchemy.dialects.postgresql import psycopg as psycopg_dialect

from taskline.store.params import FIRST_EVENTS
from taskline.store.queries import load_queries

DB = "taskline_queue_count"
BLOCK = 50


def db_url() -> str:
    return url_of(DB)


def statement(checkout: Path | None) -> str:
    """insert_jobs_with_events as psycopg runs it, from `checkout`'s SQL files (None: ours)."""
    query = load_queries(sql_source(checkout))["insert_jobs_with_events"]
    return str(query.compile(dialect=psycopg_dialect.dialect()))


def build() -> None:
    fresh_database(DB)
    with psycopg.connect(db_url(), autocommit=True) as conn:
        add(conn, "'default'", "succeeded", 20000)
        add(conn, "'busy'", "queued", 1)


def add(conn: psycopg.Connection, queue_sql: str, status: str, count: int) -> None:
    conn.execute(f"""
        INSERT INTO taskline.jobs (id, type, queue, payload, priority, status, max_retries,
                                   timeout_s, next_run_at)
        SELECT gen_random_uuid(), 'bench.noop', {queue_sql}, '{{}}', 5, %s, 3, 30, now()
        FROM generate_series(1, %s) i""", (status, count))
    conn.execute("VACUUM ANALYZE taskline.jobs")


def job(queue: str) -> tuple[str, str]:
    job_id = str(uuid.uuid4())
    return job_id, json.dumps([{
        "id": job_id, "type": "bench.noop", "queue": queue, "payload": {}, "priority": 5,
        "status": "queued", "max_retries": 3, "timeout_s": 30.0, "run_at": None,
        "delay_s": 0.0, "idempotency_key": None, "request_hash": None, "trace_context": None,
        "actor": None, "limit_key": None, "ordering_key": None, "tags": None,
        "expires_at": None, "start_within_s": None}])


def block(conn: psycopg.Connection, sql: str, queue: str) -> float:
    """The median microseconds of BLOCK writes of one job into `queue`."""
    took = []
    for _ in range(BLOCK):
        job_id, rows = job(queue)
        start = time.perf_counter()
        conn.execute(sql, {"jobs": rows, "first_events": FIRST_EVENTS, "max_queues": 1000},
                     prepare=True).fetchall()
        took.append((time.perf_counter() - start) * 1e6)
        conn.execute("UPDATE taskline.jobs SET status = 'succeeded', finished_at = now() "
                     "WHERE id = %s", (job_id,))
    return statistics.median(took)


def measure(sides: dict[str, str], queue: str, blocks: int) -> dict[str, float]:
    took: dict[str, list[float]] = {name: [] for name in sides}
    with psycopg.connect(db_url(), autocommit=True) as conn:
        for counted, order in in_turn(sides, blocks):
            for name in order:
                median = block(conn, sides[name], queue)
                if counted:
                    took[name].append(median)
    return medians(took)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backlogs", default="0,20000,200000")
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--before", type=Path, help="another checkout, its statement beside ours")
    args = parser.parse_args()
    sides = {"after": statement(None)}
    if args.before is not None:
        sides["before"] = statement(args.before)
    build()
    queued = 0
    for backlog in (int(b) for b in args.backlogs.split(",")):
        with psycopg.connect(db_url(), autocommit=True) as conn:
            add(conn, "'q' || (i %% 5)", "queued", backlog - queued)
        queued = backlog
        for queue in ("default", "busy"):
            figures = measure(sides, queue, args.blocks)
            print(json.dumps({"backlog": backlog, "queue": queue, **figures}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
