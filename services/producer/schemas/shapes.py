"""JSON representations of what the API returns; the shapes openapi.json documents.

Invariant: every value leaving here is plain JSON (ISO 8601 strings for times, floats for
PostgreSQL numerics, strings for ids), so the Flask encoder never guesses.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

from taskline.jobs import Job
from taskline.schedules import NO_SLOT, QUOTA_CLIENT, Cron, InvalidSchedule, next_due
from taskline.store.rows import ScheduleRow, StepCounts
from taskline.workflows import workflow_status

STATUSES = ("scheduled", "queued", "retrying", "running", "dead", "waiting")


def plain(value: Any) -> Any:
    """A JSON-ready copy of a value from a row."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def job(j: Job) -> dict[str, Any]:
    return j.to_dict()


def event(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: plain(row[k]) for k in ("id", "attempt", "event", "worker_id", "actor",
                                       "detail", "created_at")}


def lease(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: plain(row[k]) for k in ("id", "attempt", "worker_id", "leased_at",
                                       "leased_until", "released_at", "outcome")}


def job_detail(j: Job, events: list[Mapping[str, Any]],
               leases: list[Mapping[str, Any]]) -> dict[str, Any]:
    """A job with its history, its attempts and the lease currently held, if any."""
    open_leases = [row for row in leases if row["released_at"] is None]
    current = lease(open_leases[-1]) if open_leases and j.status == "running" else None
    return {**job(j), "events": [event(e) for e in events],
            "leases": [lease(row) for row in leases], "lease": current}


def dead(entry: Mapping[str, Any]) -> dict[str, Any]:
    return {"job": job(entry["job"]), "final_error": entry["final_error"],
            "fingerprint": entry.get("fingerprint"), "attempts": entry["attempts"],
            "failed_at": plain(entry["failed_at"])}


def dead_group(row: Mapping[str, Any]) -> dict[str, Any]:
    return {"fingerprint": row["fingerprint"], "count": int(row["count"]),
            "types": sorted(row["types"] or []), "queues": sorted(row["queues"] or []),
            "sample_error": row["sample_error"], "first_seen": plain(row["first_seen"]),
            "last_seen": plain(row["last_seen"])}


def worker(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: plain(row[k]) for k in ("id", "hostname", "pid", "queues", "concurrency",
                                       "started_at", "last_heartbeat", "heartbeat_age_s",
                                       "active_jobs", "job_ids", "metrics_port", "cpus")}


def queues(counts: Iterable[Any], depths: Mapping[str, Mapping[str, Any]] | None,
           paused: Mapping[str, Mapping[str, Any]] | None = None,
           names: Iterable[str] | None = None) -> list[dict]:
    """Per queue (`names`, or every queue the other arguments name): whether it is paused,
    PostgreSQL counts by status and by priority, and Redis depths (None: Redis unreachable, so
    `redis` is null)."""
    counts = list(counts)
    paused = paused or {}
    if names is None:
        names = set(depths or ()) | {row.queue for row in counts} | set(paused)
    names = sorted(names)
    by_queue: dict[str, dict[str, Any]] = {
        name: {"name": name, **pause_state(paused.get(name)), "counts": dict.fromkeys(STATUSES, 0),
               "priorities": {},
               "redis": None if depths is None else _redis_depths(depths.get(name))}
        for name in names}
    for row in counts:
        entry = by_queue[row.queue]
        entry["counts"][row.status] += row.n
        level = entry["priorities"].setdefault(str(row.priority), dict.fromkeys(STATUSES, 0))
        level[row.status] += row.n
    return [by_queue[name] for name in names]


def queue_totals(counts: Iterable[Any]) -> dict[str, Any]:
    """PostgreSQL counts by status, and by priority and status, summed over every queue."""
    totals: dict[str, Any] = {"counts": dict.fromkeys(STATUSES, 0), "priorities": {}}
    for row in counts:
        totals["counts"][row.status] += row.n
        level = totals["priorities"].setdefault(str(row.priority), dict.fromkeys(STATUSES, 0))
        level[row.status] += row.n
    return totals


def pause_state(row: Mapping[str, Any] | None) -> dict[str, Any]:
    """`paused`, since when and by whom, from a queue_pauses row (None: not paused)."""
    return {"paused": row is not None, "paused_at": plain(row["paused_at"]) if row else None,
            "paused_by": row["actor"] if row else None}


def _redis_depths(depth: Mapping[str, Any] | None) -> dict[str, Any]:
    depth = depth or {"ready": {}, "processing": 0, "retry": 0, "scheduled": 0, "dlq": 0}
    ready = {str(p): n for p, n in sorted(depth["ready"].items())}
    return {"ready": ready, "ready_total": sum(ready.values()),
            **{k: depth[k] for k in ("processing", "retry", "scheduled", "dlq")}}


def schedule(row: ScheduleRow) -> dict[str, Any]:
    """A schedule as the API shows it, with its next five slots."""
    job = {k: v for k, v in row.job.items() if k != QUOTA_CLIENT}
    return {"name": row.name, "cron": row.cron, "timezone": row.timezone, "job": job,
            "paused": row.paused, "catch_up": row.catch_up, "next_runs": _next_runs(row),
            "last_slot": plain(row.last_slot), "last_job_id": plain(row.last_job_id),
            "created_at": plain(row.created_at), "updated_at": plain(row.updated_at),
            "declared_in_code": row.declared_in_code}


def _next_runs(row: ScheduleRow) -> list[str]:
    if row.paused:
        return []
    try:
        cron = Cron.parse(row.cron, row.timezone)
        since = max(row.since, row.last_slot or row.since)
        first = next_due(cron, since, row.db_now)
        rest = cron.next_runs(first, 4)
    except (InvalidSchedule, *NO_SLOT):  # no slot for years to come
        return []
    return [plain(slot) for slot in (first, *rest)]


NO_STEPS = StepCounts({}, 0)
"""The counts of a workflow none of whose steps were found."""


def workflow_summary(row: dict[str, Any], counts: StepCounts) -> dict[str, Any]:
    by_status = counts.by_status
    return {"id": str(row["id"]), "name": row["name"],
            "status": workflow_status(by_status, counts.unmet),
            "created_at": plain(row["created_at"]), "steps_total": sum(by_status.values()),
            "step_counts": by_status, "condition_unmet": counts.unmet}


def workflow_step(s: dict[str, Any]) -> dict[str, Any]:
    return {"id": s["step"], "job_id": str(s["id"]), "type": s["type"], "queue": s["queue"],
            "status": s["status"], "after": list(s["after"]), "when": s["run_when"],
            "attempts": s["attempts"], "pending_parents": s["pending_parents"],
            "last_error": s["last_error"], "cancel_cause": s["cancel_cause"],
            "updated_at": plain(s["updated_at"])}


def flow_limit(row: dict[str, Any]) -> dict[str, Any]:
    """A flow limit as the API shows it (and its audit records hold it)."""
    rate = None
    if row["rate_limit"] is not None:
        rate = {"limit": row["rate_limit"], "period_s": float(row["period_s"])}
    return {"scope": row["scope"], "concurrency": row["concurrency"], "rate": rate,
            "per_key": row["per_key"], "updated_at": plain(row["updated_at"])}
