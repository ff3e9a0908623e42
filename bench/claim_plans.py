"""What one claim costs PostgreSQL by how its prepared statement is planned, and what the claim
rule's tests of ordering keys and expiry add to a job that uses neither.

A fresh database at the running virtualenv's schema holds `--backlog` finished jobs (the claim's
plan choice follows the table's size); then blocks of 100 plain jobs are enqueued (one
transaction) and each claimed alone by id through the worker's statement (`claim_jobs`,
prepared, autocommit), alternating between two rules in every block (which goes first
alternates too): the rule as migrations made it (`claimable_rule`) and the rule before ordering
keys and expiry (a copy of migration 0012's view, no expiry test, no head test). Each of
`--modes` runs in a process of its own with that plan_cache_mode: `auto` is PostgreSQL's own
choice (the default before workers forced generic plans), `force_generic_plan` what a worker
runs (taskline.store.store.make_engine's generic_plans), `force_custom_plan` a plan per call.

Prints per mode the median microseconds of a claim with each rule, their ratio, and how many
calls PostgreSQL planned generically or per call. Usage:
    python bench/claim_plans.py [--backlog 20000] [--blocks 40]
        [--modes auto,force_generic_plan,force_custom_plan]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any

import psycopg
from freshdb import fresh_database, url_of

from taskline import enqueue
from taskline.store.store import _claim_params, driver_sql

DB = "taskline_claim_plans"
PLAIN_RULE = """
CREATE OR REPLACE VIEW taskline.claimable_rule_plain AS
SELECT j.id, j.queue, j.priority, j.created_at,
       EXISTS (SELECT 1 FROM taskline.flow_limits f
               WHERE f.scope IN ('type:' || j.type, 'queue:' || j.queue)) AS limited,
       j.type, j.limit_key, j.status
FROM taskline.jobs j
WHERE NOT EXISTS (SELECT 1 FROM taskline.queue_pauses p WHERE p.queue = j.queue)
"""


def db_url(options: str = "") -> str:
    return url_of(DB) + (f"?options={options}" if options else "")


def build(backlog: int) -> None:
    """A fresh database at this checkout's schema, `backlog` finished jobs, the plain rule."""
    fresh_database(DB)
    with psycopg.connect(db_url(), autocommit=True) as conn:
        conn.execute(PLAIN_RULE)
        conn.execute("""
            INSERT INTO taskline.jobs (id, type, queue, payload, priority, status, max_retries,
                                       timeout_s, next_run_at, finished_at)
            SELECT gen_random_uuid(), 'bench.noop', 'default', '{}', 5, 'succeeded', 3, 30,
                   now(), now() FROM generate_series(1, %s)""", (backlog,))
        conn.execute("ANALYZE taskline.jobs")


def measure(mode: str, blocks: int) -> dict[str, Any]:
    """Claims per rule under `mode` (run in its own process: one plan mode per session)."""
    rule = driver_sql("claim_jobs", "taskline")
    plain = rule.replace("taskline.claimable_rule ", "taskline.claimable_rule_plain ")
    assert plain != rule, "the claim no longer reads claimable_rule"
    took: dict[str, list[float]] = {"rule": [], "plain": []}
    options = f"-cplan_cache_mode%3D{mode}"
    with psycopg.connect(db_url(options), autocommit=True) as conn:
        for block in range(blocks):
            order = [("rule", rule), ("plain", plain)]
            for name, sql in order if block % 2 else order[::-1]:
                with conn.transaction():
                    ids = [enqueue(conn, "bench.noop", {}) for _ in range(100)]
                for job_id in ids:
                    start = time.perf_counter()
                    rows = conn.execute(sql, _claim_params([job_id], "w1", 30.0, False),
                                        prepare=True).fetchall()
                    if block >= 2:  # the first two blocks prepare and warm up
                        took[name].append((time.perf_counter() - start) * 1e6)
                    assert len(rows) == 1
                conn.execute("UPDATE taskline.jobs SET status = 'succeeded', "
                             "finished_at = now() WHERE status = 'running'")
        plans = conn.execute("SELECT sum(generic_plans), sum(custom_plans) "
                             "FROM pg_prepared_statements "
                             "WHERE statement LIKE 'WITH claimed AS%%'").fetchone()
    rule_us, plain_us = statistics.median(took["rule"]), statistics.median(took["plain"])
    return {"mode": mode, "rule_us": round(rule_us, 1), "plain_rule_us": round(plain_us, 1),
            "rule_over_plain": round(rule_us / plain_us, 3),
            "generic_plans": int(plans[0]), "custom_plans": int(plans[1])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backlog", type=int, default=20000)
    parser.add_argument("--blocks", type=int, default=40)
    parser.add_argument("--modes", default="auto,force_generic_plan,force_custom_plan")
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # one mode, in a child process
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.blocks)))
        return 0
    build(args.backlog)
    for mode in args.modes.split(","):
        out = subprocess.run([sys.executable, __file__, "--measure", mode,
                              "--blocks", str(args.blocks)],
                             check=True, capture_output=True, text=True).stdout
        print(out.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
