"""Migrations create exactly the schema the metadata describes, idempotently, concurrently."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from taskline.store.migrate import alembic_config, upgrade
from taskline.store.schema import metadata
from taskline.store.store import sqlalchemy_url
from tests.integration.test_light_install import empty_database  # noqa: F401 (a fixture)


def test_migrated_schema_matches_metadata(database_url: str):
    engine = create_engine(sqlalchemy_url(database_url))
    with engine.connect() as conn:
        conn.exec_driver_sql("SET search_path TO taskline")  # the test's session, not taskline's
        partitions = {name for (name,) in conn.exec_driver_sql(
            "SELECT inhrelid::regclass::text FROM pg_inherits")}
        context = MigrationContext.configure(conn, opts={
            # The history tables' partitions (migration 0021) are no tables of their own.
            "include_name": lambda name, kind, parents: not (
                kind == "table" and name in partitions)})
        diff = compare_metadata(context, metadata)
    engine.dispose()
    assert diff == []


def test_migrate_is_idempotent_and_safe_in_parallel(database_url: str):
    """Four processes migrate at once (as containers would); all succeed, the schema is whole."""
    code = "import sys; from taskline.store.migrate import upgrade; upgrade(sys.argv[1])"
    procs = [subprocess.Popen([sys.executable, "-c", code, database_url],
                              stderr=subprocess.PIPE) for _ in range(4)]
    results = [(p.wait(120), p.stderr.read().decode()) for p in procs]
    assert [rc for rc, _ in results] == [0, 0, 0, 0], results
    upgrade(database_url)
    engine = create_engine(sqlalchemy_url(database_url))
    tables = set(inspect(engine).get_table_names(schema="taskline"))
    engine.dispose()
    assert {"jobs", "job_leases", "job_events", "dead_letter_jobs", "workers"} <= tables


def test_history_tables_are_vacuumed_at_their_churn(database_url: str):
    """Migrations 0011's and 0013's storage parameters (compare_metadata does not compare
    them): on `jobs`, and on every partition of `job_events` and `job_leases` (0021; a
    partitioned table has no storage of its own)."""
    engine = create_engine(sqlalchemy_url(database_url))
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT c.relname, c.reloptions FROM pg_class c "
            "WHERE c.relnamespace = 'taskline'::regnamespace AND (c.relname = 'jobs' OR "
            "c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent IN "
            "('taskline.job_events'::regclass, 'taskline.job_leases'::regclass)))").all()
    engine.dispose()
    options = {name: set(opts or ()) for name, opts in rows}
    expected = {"autovacuum_vacuum_scale_factor=0.01",
                "autovacuum_vacuum_insert_scale_factor=0.05",
                "autovacuum_analyze_scale_factor=0.02", "vacuum_truncate=false"}
    assert len(options) >= 1 + 2 * 4  # legacy, default and two ranges of each
    assert options == {name: expected for name in options}


def view_reads(engine, view: str) -> set[str]:
    """The relations `view`'s definition reads (its FROM list)."""
    with engine.connect() as conn:
        return {name for (name,) in conn.exec_driver_sql(
            "SELECT DISTINCT d.refobjid::regclass::text FROM pg_rewrite r "
            "JOIN pg_depend d ON d.objid = r.oid AND d.classid = 'pg_rewrite'::regclass "
            "WHERE r.ev_class = to_regclass(%(v)s) AND d.refobjid <> r.ev_class "
            "AND d.refclassid = 'pg_class'::regclass", {"v": f"taskline.{view}"})}


def test_the_fence_views_downgrade_to_0002s_and_back(empty_database: str):  # noqa: F811
    """Migration 0027: live_leases is live_leases_by_id with the plain test; its downgrade
    restores 0002's view over the leases and drops the new one; upgrading again redoes it."""
    upgrade(empty_database)
    engine = create_engine(sqlalchemy_url(empty_database))
    try:
        assert view_reads(engine, "live_leases") == {"taskline.live_leases_by_id"}
        assert "taskline.job_leases" in view_reads(engine, "live_leases_by_id")
        command.downgrade(alembic_config(empty_database), "0026")
        assert "taskline.job_leases" in view_reads(engine, "live_leases")
        with engine.connect() as conn:
            assert conn.exec_driver_sql(
                "SELECT to_regclass('taskline.live_leases_by_id')").scalar() is None
        upgrade(empty_database)
        assert view_reads(engine, "live_leases") == {"taskline.live_leases_by_id"}
    finally:
        engine.dispose()


def finish_trigger(engine: Any) -> str:
    with engine.connect() as conn:
        return conn.exec_driver_sql(
            "SELECT pg_get_triggerdef(oid) FROM pg_trigger "
            "WHERE tgname = 'jobs_finished_notify'").scalar()


def test_the_finish_signal_downgrades_to_every_finish_and_back(empty_database: str):  # noqa: F811
    """Migration 0028: the trigger fires for a watched job only; its downgrade restores 0017's
    trigger (every finish) and drops `watched`; upgrading again redoes both."""
    upgrade(empty_database)
    engine = create_engine(sqlalchemy_url(empty_database))
    try:
        assert "watched IS TRUE" in finish_trigger(engine)
        command.downgrade(alembic_config(empty_database), "0027")
        assert "watched" not in finish_trigger(engine)
        assert "'succeeded'" in finish_trigger(engine)
        with engine.connect() as conn:
            assert conn.exec_driver_sql(
                "SELECT count(*) FROM information_schema.columns WHERE table_schema = "
                "'taskline' AND table_name = 'jobs' AND column_name = 'watched'").scalar() == 0
        upgrade(empty_database)
        assert "watched IS TRUE" in finish_trigger(engine)
    finally:
        engine.dispose()
