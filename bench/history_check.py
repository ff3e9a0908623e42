"""The fault checker's per-job rules over the jobs a benchmark enqueued, read by id: run by
bench/history.py (with the newer checkout's interpreter) after migrating a large history
under load, where a whole-database snapshot (tests/faults/checker.py's) would read millions of
jobs that are not the run's.

Usage: python bench/history_check.py DATABASE_URL IDS_FILE  (one job id a line; prints JSON)
Every id must name a job that is terminal and `succeeded` (the run's jobs are no-ops), and
pass `job_violations`: legal transitions, one terminal event, one successful lease of the
newest attempt, no two leases overlapping.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import psycopg
from psycopg.rows import dict_row

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from taskline.store.queries import DEFAULT_SCHEMA, in_schema
from tests.faults.checker import Snapshot, _grouped, job_violations


def check(url: str, ids: list[str]) -> dict[str, object]:
    schema = os.environ.get("TASKLINE_SCHEMA") or DEFAULT_SCHEMA
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        def rows(sql: str) -> list[dict]:
            return conn.execute(in_schema(sql, schema), (ids,)).fetchall()
        jobs = {str(r["id"]): r for r in rows(
            "SELECT id, type, queue, status, attempts, max_retries, updated_at, created_at, "
            "expires_at FROM taskline.jobs WHERE id = ANY(%s::uuid[])")}
        snap = Snapshot(
            jobs=jobs,
            events=_grouped(rows("SELECT job_id, id, attempt, event, detail, created_at FROM "
                                 "taskline.job_events WHERE job_id = ANY(%s::uuid[]) ORDER BY id")),
            leases=_grouped(rows("SELECT job_id, id, attempt, worker_id, leased_at, leased_until,"
                                 " released_at, outcome FROM taskline.job_leases "
                                 "WHERE job_id = ANY(%s::uuid[]) ORDER BY id")),
            execs={}, effects={}, dead_letters={})
    lost = [i for i in ids if i not in jobs or jobs[i]["status"] != "succeeded"]
    violations = [f"{i}: {v}" for i in ids if i in jobs for v in job_violations(i, snap)]
    retried = sum(1 for i in ids if i in jobs and jobs[i]["attempts"] != 1)
    return {"acknowledged": len(ids), "lost_or_not_succeeded": lost[:20], "lost": len(lost),
            "violations": violations[:20], "violation_count": len(violations),
            "not_first_try": retried}


if __name__ == "__main__":
    url, ids_file = sys.argv[1], sys.argv[2]
    print(json.dumps(check(url, Path(ids_file).read_text().split())))
