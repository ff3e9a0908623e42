"""The fault checker's invariants of unique jobs and debounce, judged from PostgreSQL and the
workload's history.

Unique (the workloads use the default scope, every unfinished state, and no period): at no
instant did two jobs hold one (queue, unique key) unfinished. A job holds its key from its
`created_at` (the instant its insert ran: `statement_timestamp()`, after the key's lookup saw
the previous holder finished) until its `finished_at`, so of the jobs of a key in creation
order, each must be created no earlier than the one before it finished.

Debounce: one run per group holding every joined payload. Every arrival the API acknowledged
is in the payloads (`coalesced`) of exactly the job its answer named; no arrival is in two
jobs or twice in one (an arrival is sent once, never retried); and a debounced job that
succeeded reported, from inside its one successful run, exactly the payloads its row holds.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from itertools import pairwise
from typing import Any

Query = Callable[..., list[dict]]


def unique_violations(query: Query) -> list[str]:
    rows = query("SELECT id, queue, unique_key, created_at, finished_at FROM taskline.jobs "
                 "WHERE unique_key IS NOT NULL ORDER BY created_at, id")
    by_key: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for row in rows:
        by_key[(row["queue"], row["unique_key"])].append(row)
    found = []
    for (queue, key), jobs in by_key.items():
        for before, after in pairwise(jobs):
            if before["finished_at"] is None or after["created_at"] < before["finished_at"]:
                found.append(f"unique key {key!r} of queue {queue}: job {after['id']} created "
                             f"while job {before['id']} held it unfinished")
    return found


def debounce_violations(query: Query, arrivals: Iterable[Mapping[str, Any]]) -> list[str]:
    jobs = {str(r["id"]): r for r in query(
        "SELECT id, status, coalesced, result FROM taskline.jobs WHERE debounce_key IS NOT NULL")}
    holders: dict[str, list[str]] = defaultdict(list)
    for job_id, job in jobs.items():
        for payload in job["coalesced"] or []:
            holders[str((payload or {}).get("arrival"))].append(job_id)
    found = [f"arrival {a} is in jobs {sorted(set(h))} ({len(h)} times)"
             for a, h in holders.items() if len(h) > 1]
    for entry in arrivals:
        if entry.get("job_id") is not None and holders.get(entry["arrival"]) != [entry["job_id"]]:
            found.append(f"arrival {entry['arrival']} was answered with job {entry['job_id']} "
                         f"but is held by {holders.get(entry['arrival'], [])}")
    for job_id, job in jobs.items():
        if job["status"] == "succeeded":
            ran = (job["result"] or {}).get("coalesced")
            if ran != job["coalesced"]:
                found.append(f"debounced job {job_id} ran with {_count(ran)} payloads but "
                             f"holds {_count(job['coalesced'])}")
    return found


def _count(payloads: Any) -> int | None:
    return len(payloads) if isinstance(payloads, list) else None


def arrivals_per_job(arrivals: Iterable[Mapping[str, Any]]) -> Counter[str]:
    """How many acknowledged arrivals each debounced job was answered for."""
    return Counter(a["job_id"] for a in arrivals if a.get("job_id") is not None)
