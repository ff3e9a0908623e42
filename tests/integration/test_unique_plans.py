"""Query plans of the unique and debounce statements against real PostgreSQL: each lookup
reads its key's rows through its partial index, however many other jobs the table holds, and
the plain insert statements stay free of both (jobs without unique or debounce never touch
them)."""

from __future__ import annotations

import pytest
from sqlalchemy import text

import taskline
from taskline.store.queries import load_queries
from taskline.store.store import Store
from tests.integration.test_store_plans import insert_queued, plan

QUERIES = load_queries()
PLAIN = 5000


@pytest.fixture
def filled(store: Store) -> Store:
    """PLAIN plain jobs, 200 unique ones and 200 debounce groups, analyzed."""
    insert_queued(store, PLAIN)
    with store.engine.begin() as conn:
        for n in range(200):
            taskline.enqueue(conn, "echo", n, unique={"key": f"k{n}"})
            taskline.enqueue(conn, "echo", n, debounce={"key": f"d{n}", "delay_s": 60})
    with store.engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(
            text("ANALYZE taskline.jobs"))
    return store


def test_the_unique_lookup_reads_its_index(filled: Store) -> None:
    shown = plan(filled, "find_unique", {"queue": "default", "unique_key": "k7",
                                         "states": ["queued"], "period_s": None})
    assert "jobs_unique_key" in shown and "Seq Scan" not in shown


def test_the_debounce_join_reads_its_index(filled: Store) -> None:
    shown = plan(filled, "join_debounced", {
        "queue": "default", "type": "echo", "debounce_key": "d7", "payload": "1",
        "delay_s": 60, "span": 10, "max_joined": 1000, "max_bytes": 1_048_576,
        "event": "joined", "actor": None})
    assert "jobs_debounce" in shown and "Seq Scan on jobs" not in shown


@pytest.mark.parametrize("name", ["insert_job", "insert_jobs_with_events",
                                  "enqueue_in_transaction", "enqueue_one_in_transaction"])
def test_plain_inserts_do_not_know_the_keys(name: str) -> None:
    sql = str(QUERIES[name])
    assert "unique_key" not in sql and "debounce_key" not in sql and "advisory" not in sql
