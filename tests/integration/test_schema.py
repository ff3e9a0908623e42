"""taskline in a schema of its own (TASKLINE_SCHEMA): nothing of it outside that schema, every
statement naming it, and a whole installation working under another name while the
connections' `search_path` holds nothing of taskline.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import create_engine, text

import taskline
from taskline.settings import Settings
from taskline.store.bulk import _COPY_EVENTS, _COPY_JOBS
from taskline.store.migrate import upgrade
from taskline.store.queries import channel, in_schema, load_queries
from taskline.store.store import Store, sqlalchemy_url
from tests.conftest import db_url
from tests.helpers import service, service_env, wait_for

SYSTEM = ("pg_catalog", "information_schema", "pg_toast")
OBJECTS = """
SELECT n.nspname AS schema, c.relname AS name FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace WHERE NOT n.nspname = ANY(%(system)s)
UNION ALL SELECT n.nspname, p.proname FROM pg_proc p
  JOIN pg_namespace n ON n.oid = p.pronamespace WHERE NOT n.nspname = ANY(%(system)s)
UNION ALL SELECT n.nspname, t.typname FROM pg_type t
  JOIN pg_namespace n ON n.oid = t.typnamespace
  WHERE NOT n.nspname = ANY(%(system)s) AND t.typrelid = 0 AND t.typelem = 0
"""
# A relation a statement reads or writes: what follows FROM, JOIN, INTO, UPDATE, COPY or a
# comma inside a FROM list. A CTE's name, a function call, a subquery or extract's
# `epoch FROM column` is no relation.
RELATION = re.compile(r"(?<!epoch )\b(?:FROM|JOIN|INTO|UPDATE|COPY)\s+(?!LATERAL\b|ROWS\b)"
                      r"([a-z_][\w.]*)(?![\w.]|\s*\()")
CTE = re.compile(r"\b(\w+)(?:\s*\([\w\s,]*\))?\s+AS\s+(?:NOT\s+)?(?:MATERIALIZED\s+)?\(")


@pytest.fixture
def empty_database() -> Iterator[str]:
    name = f"taskline_schema_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(db_url("postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield db_url(name)
    with psycopg.connect(db_url("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def objects(url: str) -> set[tuple[str, str]]:
    with psycopg.connect(url) as conn:
        return {tuple(r) for r in conn.execute(OBJECTS, {"system": list(SYSTEM)})}


def test_nothing_of_taskline_lies_outside_its_schema(empty_database: str):
    upgrade(empty_database, create=False)
    found = objects(empty_database)
    assert {schema for schema, _ in found} == {"taskline"}
    assert ("taskline", "alembic_version") in found and ("taskline", "jobs") in found


@pytest.mark.parametrize("schema", ["taskline", "tl_app"])
def test_every_statement_names_the_schema_of_every_relation(schema: str):
    statements = {name: str(q) for name, q in load_queries(schema=schema).items()}
    statements["copy_jobs"] = in_schema(_COPY_JOBS, schema)  # as taskline.store.bulk runs it
    statements["copy_events"] = in_schema(_COPY_EVENTS, schema)
    unqualified = {}
    for name, sql in statements.items():
        ctes = set(CTE.findall(sql))
        bare = [r for r in RELATION.findall(sql) if "." not in r and r not in ctes]
        if bare:
            unqualified[name] = bare
    assert unqualified == {}
    if schema != "taskline":
        assert not any("taskline." in sql or "'taskline_" in sql for sql in statements.values())


def test_the_checks_above_can_fail():
    sql = ("WITH picked AS (SELECT id, extract(epoch FROM created_at) FROM jobs) "
           "UPDATE taskline.jobs SET x = 1 FROM picked")
    ctes = set(CTE.findall(sql))
    assert [r for r in RELATION.findall(sql) if "." not in r and r not in ctes] == ["jobs"]


def test_an_installation_under_another_schema_runs_jobs(empty_database: str, redis_url: str,
                                                        settings: Settings, tmp_path: Path):
    """Schema `tl_app`, nothing else of taskline in the database, and every connection's
    search_path (the database's default) names no schema of taskline: the library, a worker
    and maintenance all work, and the enqueue is signalled on the installation's channel."""
    url = empty_database
    with psycopg.connect(db_url("postgres"), autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{url.rsplit("/", 1)[1]}" SET search_path = pg_catalog')
    upgrade(url, create=False, schema="tl_app")
    assert {schema for schema, _ in objects(url)} == {"tl_app"}
    own = settings.replace(database_url=url, redis_url=redis_url, schema="tl_app")
    with psycopg.connect(url, autocommit=True) as listener:
        listener.execute(f"LISTEN {channel('tl_app', 'enqueued')}")
        engine = create_engine(sqlalchemy_url(url))
        with engine.begin() as conn:
            ids = [taskline.enqueue(conn, "echo", {"n": n}, settings=own) for n in range(3)]
        engine.dispose()
        notes = list(listener.notifies(timeout=2, stop_after=1))
    assert [n.payload for n in notes] == ["default"]
    store = Store.connect(url, pool_size=2, schema="tl_app")
    env = service_env(own)
    try:
        with service(["worker", "--metrics-port", "0"], env, tmp_path), \
                service(["maintenance", "--metrics-port", "0"], env, tmp_path):
            wait_for(lambda: all(store.get_job(i).status == "succeeded" for i in ids),
                     timeout=30, message="the jobs to succeed")
        assert [store.get_job(i).result for i in ids] == [{"n": n} for n in range(3)]
    finally:
        store.dispose()


def test_an_unqualified_name_would_fail_here(empty_database: str):
    """The premise of the suite: a connection's default search_path finds no taskline table, so
    any statement that does not name the schema fails instead of passing by luck."""
    upgrade(empty_database, create=False)
    engine = create_engine(sqlalchemy_url(empty_database))
    with engine.connect() as conn:
        assert conn.execute(text("SELECT to_regclass('jobs')")).scalar() is None
        assert conn.execute(text("SELECT to_regclass('taskline.jobs')")).scalar() is not None
    engine.dispose()
