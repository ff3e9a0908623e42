"""How many jobs each claim and each outcome statement carries during a drain, as PostgreSQL
counts them: the figure behind the worker's claim batches (services/worker/pace.py).

Starts a private PostgreSQL with pg_stat_statements (bench/costs.py's) and drains `--jobs` jobs
of one benchmark handler with two worker processes of `--slots` handler threads each, through
the benchmark's own drain (bench/scenarios.py), which also reports CPU per job by component.
Then prints, for the most called statements, their calls, the rows they returned per call
(for the claim, jobs claimed; for `settle`, attempts ended) and their execution time per job.

Usage: python bench/claim_batches.py [--handler sleep10] [--slots 8] [--jobs 10000]
"""

from __future__ import annotations

import argparse
import sys

import psycopg
import scenarios
from costs import CountingPostgres
from stack import Stack, open_stack


class CountedStack(Stack):
    """The benchmark's stack, each fresh database counting its statements from zero."""

    def reset(self) -> None:
        super().reset()
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute("SELECT pg_stat_statements_reset()")


def statement_counts(url: str, jobs: int, top: int = 6) -> list[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT calls, rows, total_exec_time, query FROM pg_stat_statements s "
            "JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = current_database() "
            "ORDER BY calls DESC LIMIT %s", (top,)).fetchall()
    return [f"{calls:7d} calls {rows / max(calls, 1):7.2f} rows/call "
            f"{ms * 1000 / jobs:7.1f} us/job  {' '.join(query.split())[:70]}"
            for calls, rows, ms, query in rows]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--handler", default="sleep10", help="bench.<handler> (benchjobs.py)")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=10000,
                        help="a multiple of 1,000 (the backlog is enqueued in batches of 1,000)")
    args = parser.parse_args()
    with open_stack(False, postgres=CountingPostgres, kind=CountedStack) as stack:
        rate = scenarios.drain(stack, args.jobs, 2, job_type=f"bench.{args.handler}",
                               concurrency=args.slots)
        print(f"{args.handler} 2 x {args.slots}: {rate:.0f} jobs/s, CPU ms per job "
              + ", ".join(f"{k} {v:.3f}" for k, v in (stack.last_cpu or {}).items()))
        print("\n".join(statement_counts(stack.url, args.jobs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
