"""What one `settle` of 10 attempts costs PostgreSQL by the leases ended since the last vacuum,
with this checkout's statement and, side by side, another checkout's.

A fresh database at the running virtualenv's schema, ANALYZEd with 20,000 ended leases (a
history) and 40 open ones (with `--no-analyze` the leases have no statistics, as a new history
partition until autovacuum first analyzes it); then, for each `--ended` count, that many more
leases are ended without a vacuum (as between two autovacuum runs: their entries stay in the
open-lease index). Each round claims 10 queued jobs and times `settle` of their leases as the
worker runs it (prepared, generic plan), by `EXPLAIN (ANALYZE)` inside a transaction rolled
back, so the same leases serve both sides; the sides alternate, which goes first alternates too.

Prints per count the median execution time in microseconds for each side and their ratio
(before / after: above 1, cheaper now). Usage:
    python bench/settle_plan.py [--ended 0,20000,100000] [--rounds 30] [--before <checkout>]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import psycopg
from freshdb import fresh_database, url_of
from psycopg import sql
from sides import in_turn, medians, sql_source

from taskline import transitions
from taskline.store.queries import load_queries
from taskline.store.rows import Settlement
from taskline.store.store import Store

DB = "taskline_settle_plan"
SETTLED = 10
HISTORY, OPEN = 20000, 40


PARAMS = ("settlements", "lease_ids", "lease_min", "lease_max")
"""settle's parameters, as $1 - $4 (a checkout before the ids' bounds uses the first two)."""


def statement(checkout: Path | None) -> str:
    """`settle` from `checkout`'s SQL files (None: ours), its parameters numbered as PARAMS."""
    text = load_queries(sql_source(checkout))["settle"].text
    for n, name in enumerate(PARAMS, start=1):
        text = re.sub(rf"(?<!:):{name}\b", f"${n}", text)
    return text


def claimed(store: Store, count: int) -> list[int]:
    """Lease ids of `count` new jobs claimed by one worker."""
    with psycopg.connect(url_of(DB), autocommit=True) as conn:
        ids = [str(r[0]) for r in conn.execute(
            "INSERT INTO taskline.jobs (id, type, queue, payload, priority, status, max_retries, "
            "timeout_s, next_run_at) SELECT gen_random_uuid(), 'bench.noop', 'default', '{}', 5, "
            "'queued', 3, 30, now() FROM generate_series(1, %s) RETURNING id", (count,))]
    leases: list[int] = []
    for start in range(0, len(ids), 1000):
        leases += [c.lease_id for c in store.claim_jobs(ids[start:start + 1000], "w1", 300)]
    return leases


def end(leases: list[int]) -> None:
    with psycopg.connect(url_of(DB), autocommit=True) as conn:
        conn.execute("UPDATE taskline.job_leases SET released_at = now() WHERE id = ANY(%s)",
                     (leases,))


def timed(conn: psycopg.Connection, name: str, leases: list[int]) -> float:
    """Execution time (us) of prepared statement `name` settling `leases`, rolled back."""
    doc = json.dumps({str(lease): Settlement(lease, "w1", transitions.succeeded(None))
                      .to_input(lapsed=False) for lease in leases})
    ids = "{" + ",".join(map(str, leases)) + "}"
    query = sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE {}({}, {}, {}, {})").format(
        sql.Identifier(name), sql.Literal(doc), sql.Literal(ids), sql.Literal(min(leases)),
        sql.Literal(max(leases)))
    plan = conn.execute(query).fetchone()[0][0]
    conn.rollback()
    return float(plan["Execution Time"]) * 1000


def measure(store: Store, sides: dict[str, str], rounds: int) -> dict[str, float]:
    took: dict[str, list[float]] = {name: [] for name in sides}
    with psycopg.connect(url_of(DB)) as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        for name, text in sides.items():
            conn.execute(f"PREPARE {name} (text, text, bigint, bigint) AS {text}")
        conn.commit()
        for counted, order in in_turn(sides, rounds):
            leases = claimed(store, SETTLED)
            for name in order:
                value = timed(conn, name, leases)
                if counted:
                    took[name].append(value)
            end(leases)
    return medians(took)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ended", default="0,20000,100000")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--before", type=Path, help="another checkout, its statement beside ours")
    parser.add_argument("--no-analyze", action="store_true",
                        help="no statistics on the leases, as on a partition autovacuum has not "
                             "analyzed yet")
    args = parser.parse_args()
    sides = {"after": statement(None)}
    if args.before is not None:
        sides["before"] = statement(args.before)
    fresh_database(DB)
    store = Store.connect(url_of(DB), pool_size=2)
    try:
        end(claimed(store, HISTORY))
        claimed(store, OPEN)
        with psycopg.connect(url_of(DB), autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE taskline.jobs" if args.no_analyze
                         else "VACUUM ANALYZE taskline.jobs, taskline.job_leases")
        done = 0
        for count in (int(c) for c in args.ended.split(",")):
            end(claimed(store, count - done))
            done = count
            print(json.dumps({"ended_since_vacuum": count, **measure(store, sides, args.rounds)}),
                  flush=True)
    finally:
        store.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
