"""Query plans against real PostgreSQL: the lease-joined statements find running jobs by primary
key even when the statistics were taken while nothing ran.

Such statistics estimate one running job; the planner then read every running job through the
status index once per lease of the statement, a cost that grows with the fleet (store/sql
explains the form that prevents it).
"""

from __future__ import annotations

import json
import uuid

import pytest
from sqlalchemy import text

from taskline import transitions
from taskline.jobs import new_job_id
from taskline.store.queries import load_queries
from taskline.store.rows import Settlement
from taskline.store.store import Store, lease_span

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
            text("ANALYZE taskline.jobs, taskline.job_leases"))
    return [c.lease_id for c in store.claim_jobs(ids[:RUNNING], "w1", 30)]


def plan(store: Store, name: str, params: dict) -> str:
    with store.engine.connect() as conn:
        rows = conn.execute(text("EXPLAIN " + str(QUERIES[name])), params).all()
        conn.rollback()
    return "\n".join(r[0] for r in rows)


def settle_params(leases: list[int], transition: transitions.Transition) -> dict:
    rows = {str(lease): Settlement(lease, "w1", transition).to_input(lapsed=False)
            for lease in leases}
    return {"settlements": json.dumps(rows), "lease_ids": leases, **lease_span(leases)}


@pytest.mark.parametrize("name, params", [
    ("settle", lambda leases: settle_params(leases, transitions.succeeded(None))),
    ("settle", lambda leases: settle_params(leases, transitions.handed_back())),
    ("settle_succeeded", lambda leases: {"lease_ids": leases, "results": "{}",
                                         "worker_id": "w1", "status": "succeeded",
                                         "event": "succeeded", "outcome": "succeeded",
                                         **lease_span(leases)}),
    ("renew_leases", lambda leases: {"lease_ids": leases, "worker_id": "w1", "lease_s": 30,
                                     **lease_span(leases)}),
])
def test_batched_lease_statements_find_jobs_by_primary_key(store: Store, leases, name, params):
    shown = plan(store, name, params(leases))
    assert "jobs_pkey" in shown
    assert "jobs_status_created" not in shown and "Seq Scan on jobs" not in shown


def test_recovery_and_lease_expiry_find_jobs_by_primary_key(store: Store, leases):
    for name, params in [("expired_leases", {"limit": 100}), ("next_lease_expiry", {})]:
        shown = plan(store, name, params)
        assert "jobs_status_created" not in shown and "Seq Scan on jobs" not in shown, name


FINISHED = 20_000


@pytest.fixture
def finished_table(store: Store) -> None:
    """FINISHED succeeded jobs (a tenth of them old), QUEUED queued ones and a few finished
    before migration 0004 (finished_at NULL), analyzed: big enough that scanning is never
    the cheap plan."""
    with store.engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        conn.execute(text(
            "INSERT INTO taskline.jobs (id, type, queue, payload, priority, status, max_retries, "
            "timeout_s, created_at, updated_at, finished_at) "
            "SELECT gen_random_uuid(), 'echo', 'default', '{}', 5, "
            "CASE WHEN n % 50 = 0 THEN 'dead' ELSE 'succeeded' END, 3, 30, now(), now(), "
            "CASE WHEN n % 97 = 0 THEN NULL "
            "     ELSE now() - make_interval(secs => CASE WHEN n % 10 = 0 THEN 7200 ELSE 60 END) "
            "END FROM generate_series(1, :n) AS n"), {"n": FINISHED})
    insert_queued(store, QUEUED)
    with store.engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("ANALYZE taskline.jobs"))


def generic_plan(store: Store, name: str, types: dict[str, str], values: str,
                 sql: str | None = None) -> str:
    """EXPLAIN of query `name` (or of the text `sql`) prepared with parameters of `types` under
    a generic plan (what a statement prepared by the driver settles on), executed with
    `values`."""
    sql = str(QUERIES[name]) if sql is None else sql
    for n, param in enumerate(types, start=1):
        sql = sql.replace(f":{param}", f"${n}")
    with store.engine.connect() as conn:
        driver = conn.connection.driver_connection
        driver.execute("SET plan_cache_mode = force_generic_plan")
        driver.execute(f"PREPARE q ({', '.join(types.values())}) AS {sql}")
        rows = driver.execute(f"EXPLAIN EXECUTE q({values})").fetchall()
        driver.execute("DEALLOCATE q")
        driver.execute("RESET plan_cache_mode")
        conn.rollback()
    return "\n".join(r[0] for r in rows)


def test_the_expiry_selection_reads_the_finished_at_indexes_never_the_table(store: Store,
                                                                           finished_table):
    params = {"status": "text", "retain_s": "float8", "limit": "int"}
    for shown in (plan(store, "expire_finished",
                       {"status": "succeeded", "retain_s": 3600.0, "limit": 5000}),
                  generic_plan(store, "expire_finished", params, "'succeeded', 3600, 5000")):
        assert "jobs_finished " in shown and "jobs_finished_unstamped " in shown, shown
        assert "jobs_pkey" in shown and "Seq Scan" not in shown, shown
    ages = generic_plan(store, "oldest_finished", {"statuses": "text[]"},
                        "'{succeeded,cancelled,dead}'")
    assert "jobs_finished" in ages and "Seq Scan on jobs" not in ages, ages


def test_events_and_leases_of_a_deleted_job_are_found_by_job_id_indexes(store: Store):
    """The foreign keys' cascades delete by job_id: each table needs an index leading with it
    (otherwise every deleted job would scan job_events whole). The history tables have no
    cascade since migration 0021 (their rows go with their partition), but a job's page reads
    its events and leases by job_id through the same indexes."""
    with store.engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT t.relname, a.attname FROM pg_index i "
            "JOIN pg_class t ON t.oid = i.indrelid "
            "JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = i.indkey[0] "
            "WHERE t.relnamespace = 'taskline'::regnamespace "
            "AND t.relname IN ('job_events', 'job_leases', 'dead_letter_jobs', "
            "'job_dependencies')")).all()
        cascades = conn.execute(text(
            "SELECT conrelid::regclass::text FROM pg_constraint "
            "WHERE contype = 'f' AND confrelid = 'taskline.jobs'::regclass "
            "AND confdeltype = 'c'")).all()
    leading = {(r.relname, r.attname) for r in rows}
    assert {("job_events", "job_id"), ("job_leases", "job_id"),
            ("dead_letter_jobs", "job_id")} <= leading
    # A workflow edge cascades from both of its jobs: an index leads with each column.
    assert {("job_dependencies", "parent_id"), ("job_dependencies", "child_id")} <= leading
    assert sorted(r[0] for r in cascades) == [
        "taskline.dead_letter_jobs", "taskline.job_dependencies", "taskline.job_dependencies"]


def test_the_claim_from_postgresql_reads_the_claim_index_in_order(store: Store):
    insert_queued(store, QUEUED)
    with store.engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("ANALYZE taskline.jobs"))
    shown = plan(store, "due_queued_ids", {"queue": "default", "limit": 50})
    assert "jobs_claimable" in shown
    assert "Sort" not in shown and "Seq Scan on jobs" not in shown
    assert "One-Time Filter" in shown  # the queue's pause is checked once, not per job


def test_bulk_dead_letter_batches_never_scan_the_jobs_table(store: Store):
    """A bulk requeue or purge reads dead jobs through indexes (the status index or the DLQ
    rows' keys) and changes each by primary key, however many finished jobs the table holds."""
    with store.transaction() as conn:
        conn.execute(text(
            "INSERT INTO taskline.jobs (id, type, queue, payload, priority, status, max_retries, "
            "timeout_s) SELECT gen_random_uuid(), 'echo', 'default', '{}', 5, CASE WHEN n % 50 "
            "= 0 THEN 'dead' ELSE 'succeeded' END, 0, 30 FROM generate_series(1, 50000) n"))
        conn.execute(text("INSERT INTO taskline.dead_letter_jobs (job_id, attempts) "
                          "SELECT id, 1 FROM taskline.jobs WHERE status = 'dead'"))
    with store.engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(
            text("ANALYZE taskline.jobs, taskline.dead_letter_jobs"))
    for queue, job_type in (("default", None), (None, "echo")):
        params = {"queue": queue, "type": job_type, "ids": None, "after": str(uuid.UUID(int=0)),
                  "limit": 500, "actor": None, "sources": ["dead"], "target": "queued",
                  "event": "requeued", "fingerprint": None, "cascade_target": "cancelled",
                  "cascade_event": "cancelled", "cause": "parent_purged",
                  "release_target": "queued", "release_event": "unblocked"}
        for name in ("requeue_dead_batch", "purge_dead_batch", "count_dead_matching"):
            shown = plan(store, name, params)
            assert "Seq Scan on jobs" not in shown, (name, shown)
        for name in ("requeue_dead_batch", "purge_dead_batch"):
            assert "jobs_pkey" in plan(store, name, params), name


def test_the_outbox_page_looks_its_jobs_up_by_primary_key(store: Store):
    """A page of 1,000 outbox rows must not hash-join all of jobs (100 million rows in
    production): each row's job is one primary-key lookup."""
    ids = insert_queued(store, QUEUED)
    with store.engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        conn.execute(text("INSERT INTO taskline.enqueue_outbox (job_id, queue) "
                          "SELECT CAST(id AS uuid), 'default' FROM unnest(CAST(:ids AS text[])) "
                          "AS t(id)"), {"ids": ids[:2000]})
        conn.execute(text("ANALYZE taskline.jobs, taskline.enqueue_outbox"))
    page = plan(store, "outbox_page", {"limit": 1000})
    assert "jobs_pkey" in page and "Seq Scan on jobs" not in page, page
    assert len(store.outbox_page(1000)) == 1000


def test_a_claim_reads_its_ids_by_primary_key_after_statistics_of_an_empty_queue(store: Store):
    """Statistics taken while nothing was queued (only finished history) estimate one queued
    job; a claim must still read its ids by primary key, never every queued job (once per id,
    that is quadratic: a claim of 64 ids over 200,000 queued jobs took minutes)."""
    insert_queued(store, QUEUED)
    with store.engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        conn.execute(text("UPDATE taskline.jobs SET status = 'succeeded', finished_at = now()"))
        conn.execute(text("ANALYZE taskline.jobs"))
    ids = insert_queued(store, QUEUED)
    params = {"ids": "{" + ",".join(ids[:64]) + "}", "worker_id": "w1", "lease_s": 30,
              "limited": False, "target": "running", "event": "claimed"}
    for name, args in (("claim_jobs", params), ("claim_refusals", {"ids": params["ids"]})):
        shown = plan(store, name, args)
        assert "jobs_pkey" in shown, shown
        for scan in ("jobs_claimable", "jobs_status_created", "jobs_pending_id",
                     "Seq Scan on jobs"):
            assert scan not in shown, (name, shown)


def test_keyed_jobs_are_read_through_their_index_never_the_unkeyed_backlog(store: Store):
    """The budgeted claim's keyed reads (no flow limit) and the claim rule's head gate read
    jobs_ordering: a queue's long backlog of jobs without a key is never read for them."""
    insert_queued(store, QUEUED)
    with store.engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(
            text("ANALYZE taskline.jobs"))
    params = {"queues": ["default"], "limit": 32, "skip": [], "ids": [str(uuid.uuid4())]}
    for name in ("keyed_heads", "keyed_waiting", "ordering_key_counts"):
        shown = plan(store, name, params)
        assert "jobs_ordering" in shown, (name, shown)
        assert "jobs_claimable" not in shown and "Seq Scan on jobs" not in shown, (name, shown)


def test_lists_by_state_read_the_narrowed_status_index_or_the_newest_jobs(store: Store):
    """Migration 0022: a rare state's page comes from jobs_status_created_not_succeeded, a
    page of succeeded jobs (most of the table) from a backward read of jobs_created."""
    ids = insert_queued(store, 20_000)
    with store.transaction() as conn:
        conn.execute(text("UPDATE taskline.jobs SET status = 'succeeded', finished_at = now() "
                          "WHERE id <> ALL(CAST(:few AS uuid[]))"), {"few": ids[:20]})
        conn.execute(text("UPDATE taskline.jobs SET status = 'dead', finished_at = now() "
                          "WHERE id = ANY(CAST(:few AS uuid[]))"), {"few": ids[:20]})
    with store.engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(
            text("ANALYZE taskline.jobs"))
    page = {"tag": None, "type": None, "queue": None, "after_created": None, "after_id": None,
            "limit": 50}
    dead = plan(store, "list_jobs", {**page, "status": "dead"})
    assert "jobs_status_created_not_succeeded" in dead and "Seq Scan" not in dead, dead
    succeeded = plan(store, "list_jobs", {**page, "status": "succeeded"})
    assert "Index Scan Backward using jobs_created" in succeeded, succeeded



KEYS = 10


def keyed_backlog(store: Store) -> list[str]:
    """QUEUED queued jobs over KEYS ordering keys (lines of QUEUED / KEYS) and no job without a
    key, vacuumed (the keys' update leaves no dead entries to read) and analyzed: the ids of
    the keys' heads."""
    insert_queued(store, QUEUED)
    with store.transaction() as conn:
        conn.execute(text("UPDATE taskline.jobs SET ordering_key = 'k' || (get_byte(uuid_send(id), "
                          "15) % :keys)"), {"keys": KEYS})
        heads = conn.execute(text("SELECT DISTINCT ON (ordering_key) id FROM taskline.jobs "
                                  "ORDER BY ordering_key, created_at, id")).scalars().all()
    with store.engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(
            text("VACUUM ANALYZE taskline.jobs"))
    assert len(heads) == KEYS
    return [str(h) for h in heads]


def analyzed(store: Store, name: str, params: dict) -> tuple[str, int]:
    """The plan `name` ran with (rolled back) and the shared buffers it touched."""
    with store.engine.connect() as conn:
        rows = conn.execute(text("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
                                 + str(QUERIES[name])), params).scalar_one()
        conn.rollback()
    top = rows[0]["Plan"]
    return json.dumps(rows), top["Shared Hit Blocks"] + top["Shared Read Blocks"]


def test_a_turn_started_in_place_reads_one_entry_of_its_line_and_no_backlog(store: Store):
    """Migration 0023: settle_turning finds each finished head's next job as the first entry of
    jobs_ordering_line past it (never reading or sorting the line), and its "no job without a
    key queued at least as urgent" test is one probe of jobs_plain_queued: through
    jobs_claimable it read every queued keyed job of the queue, once per turn (3,111 buffers
    for these 10 turns on migration 0022, 619 on 0023)."""
    leases = [c.lease_id for c in store.claim_keyed(keyed_backlog(store), "w1", 30)]
    assert len(leases) == KEYS
    params = {**settle_params(leases, transitions.succeeded(None)), "target": "running",
              "event": "claimed", "worker_id": "w1", "lease_s": 30, "served": ["default"],
              "most": KEYS}
    params["lease_ids"] = "{" + ",".join(map(str, leases)) + "}"
    shown, buffers = analyzed(store, "settle_turning", params)
    assert "jobs_ordering_line" in shown and "jobs_plain_queued" in shown, shown
    assert "jobs_claimable" not in shown, shown
    assert buffers < 100 * KEYS, (buffers, shown)


def test_the_head_test_is_one_probe_per_job_however_long_its_line(store: Store):
    """Migration 0023: the claim rule's head test reads "none earlier in line" from
    jobs_ordering_line and "none of its key running" from jobs_ordering_running, one probe
    each: a head's test no longer reads its whole line (500 jobs here) to find neither (1,822
    buffers for these 10 heads on migration 0022, 132 on 0023)."""
    shown, buffers = analyzed(store, "keyed_heads_among",
                              {"ids": "{" + ",".join(keyed_backlog(store)) + "}"})
    assert "jobs_ordering_line" in shown and "jobs_ordering_running" in shown, shown
    assert buffers < 20 * KEYS, (buffers, shown)
