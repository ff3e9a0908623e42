"""Query plans against real PostgreSQL: the lease-joined statements find running jobs by primary
key even when the statistics were taken while nothing ran.

Such statistics estimate one running job; the planner then read every running job through the
status index once per lease of the statement, a cost that grows with the fleet (queries.sql
explains the form that prevents it).
"""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from taskline import transitions
from taskline.jobs import new_job_id
from taskline.store.queries import load_queries
from taskline.store.rows import Settlement
from taskline.store.store import Store

QUERIES = load_queries()
RUNNING = 40
QUEUED = 5000


def insert_queued(store: Store, count: int) -> list[str]:
    """Ids of `count` new queued jobs, inserted in one statement."""
    rows = [{"id": str(new_job_id()), "type": "echo", "queue": "default", "payload": {},
             "priority": 5, "status": "queued", "max_retries": 3, "timeout_s": 30.0,
             "run_at": None, "delay_s": 0, "idempotency_key": None, "request_hash": None,
             "trace_context": None} for _ in range(count)]
    store.insert_jobs_with_events(rows)
    return [r["id"] for r in rows]


@pytest.fixture
def leases(store: Store) -> list[int]:
    """Lease ids of RUNNING running jobs among QUEUED queued ones, after an ANALYZE with none
    running (the table is large enough that reading all of it is never the cheap plan)."""
    ids = insert_queued(store, QUEUED)
    with store.engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(
            text("ANALYZE jobs, job_leases"))
    return [c.lease_id for c in store.claim_jobs(ids[:RUNNING], "w1", 30)]


def plan(store: Store, name: str, params: dict) -> str:
    with store.engine.connect() as conn:
        rows = conn.execute(text("EXPLAIN " + str(QUERIES[name])), params).all()
        conn.rollback()
    return "\n".join(r[0] for r in rows)


def settle_params(leases: list[int], transition: transitions.Transition) -> dict:
    rows = [Settlement(lease, "w1", transition).to_input(lapsed=False) for lease in leases]
    return {"settlements": json.dumps(rows)}


@pytest.mark.parametrize("name, params", [
    ("settle", lambda leases: settle_params(leases, transitions.succeeded(None))),
    ("settle", lambda leases: settle_params(leases, transitions.handed_back())),
    ("renew_leases", lambda leases: {"lease_ids": leases, "worker_id": "w1", "lease_s": 30}),
])
def test_batched_lease_statements_find_jobs_by_primary_key(store: Store, leases, name, params):
    shown = plan(store, name, params(leases))
    assert "jobs_pkey" in shown
    assert "jobs_status_created" not in shown and "Seq Scan on jobs" not in shown


def test_recovery_and_lease_expiry_find_jobs_by_primary_key(store: Store, leases):
    for name, params in [("expired_leases", {"limit": 100}), ("next_lease_expiry", {})]:
        shown = plan(store, name, params)
        assert "jobs_status_created" not in shown and "Seq Scan on jobs" not in shown, name
