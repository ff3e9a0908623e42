"""Moving an installation whose objects are in `public` into TASKLINE_SCHEMA, online.

Releases before the schema setting created every table, view and function of taskline, and
its `alembic_version`, in `public`. `taskline migrate` moves them: `ALTER ... SET SCHEMA` is a
catalog change (no row is copied or rewritten; indexes, constraints, triggers and owned
sequences go with their table), taken under a short lock_timeout and retried (after a deadlock
with a running statement too), so a busy table is never queued behind for long. taskline's
version row moves into the schema's own version table; only that row leaves
`public.alembic_version`, which is dropped when nothing else is left in it.

Invariant: processes of the earlier release, which name tables unqualified and find them
through `search_path` (public), keep working through the move and after it: in the same
transaction each moved table and view gets a compatibility view of its name in `public`,
`SELECT *` of one relation, which PostgreSQL updates automatically (INSERT ... ON CONFLICT,
UPDATE, DELETE ... RETURNING and FOR UPDATE SKIP LOCKED go through to the table). The one
statement such a view cannot take is COPY, which earlier API processes use for a batch of 100
or more jobs without idempotency keys (docs/deployment.md). `finish_move` drops those views
once no process of the earlier release runs.
"""

from __future__ import annotations

import logging
import time

from sqlalchemy import Connection, text

log = logging.getLogger(__name__)

TABLES = ("jobs", "job_events", "job_leases", "dead_letter_jobs", "workers", "audit_log",
          "schedules", "schedule_slots", "enqueue_outbox", "queue_pauses", "flow_limits",
          "flow_starts", "leader_leases", "workflows", "job_dependencies")
"""Every table a release before the schema setting created in `public`."""
VIEWS = ("live_leases", "claimable_rule", "claimable_jobs")
FUNCTIONS = ("audit_log_append_only()",)
REVISIONS = tuple(f"{n:04d}" for n in range(1, 14))
"""The revisions such a release could be at (0001 - 0013)."""
LOCK_TIMEOUT = "2s"
ATTEMPTS = 30
TRANSIENT = ("lock timeout", "deadlock detected")
"""The errors after which a try of the move is taken again."""


def legacy_revision(conn: Connection) -> str | None:
    """taskline's revision in `public.alembic_version` when taskline's tables are in `public`
    (None otherwise): an application's own revision of the same name never matches, because
    taskline's tables must be there beside it."""
    present = conn.execute(text(
        "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'public' AND c.relkind = 'r' AND c.relname = ANY(:names)"),
        {"names": list(TABLES[:5])}).scalar_one()
    if present < 5 or conn.execute(text(
            "SELECT to_regclass('public.alembic_version')")).scalar_one() is None:
        return None
    rows = conn.execute(text("SELECT version_num FROM public.alembic_version")).scalars().all()
    ours = [r for r in rows if r in REVISIONS]
    return ours[0] if ours else None


def move_from_public(conn: Connection, schema: str) -> str | None:
    """Move a pre-schema installation into `schema` (a no-op when there is none); the revision
    moved. `conn` is outside any transaction; each try is one transaction of its own."""
    if schema == "public":
        return None
    for attempt in range(1, ATTEMPTS + 1):
        try:
            with conn.begin():
                revision = legacy_revision(conn)
                if revision is not None:
                    _move(conn, schema, revision)
            if revision is not None:
                log.info("moved taskline's tables from public into its schema",
                         extra={"action": "migrate", "schema": schema, "revision": revision})
            return revision
        except Exception as err:
            # A lock timeout (an old transaction holds a table) or a deadlock (a running
            # statement took a view, then waits for a table this try moved first): the try was
            # rolled back whole, so it is taken again.
            if not any(s in str(err) for s in TRANSIENT) or attempt == ATTEMPTS:
                raise
            log.warning("a table is busy; moving again", extra={"action": "migrate"})
            time.sleep(min(0.1 * attempt, 1.0))
    return None


def _move(conn: Connection, schema: str, revision: str) -> None:
    conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    conn.exec_driver_sql(f"CREATE SCHEMA IF NOT EXISTS {schema}")
    for name in _present(conn, TABLES, "r"):
        conn.exec_driver_sql(f"ALTER TABLE public.{name} SET SCHEMA {schema}")
    for name in _present(conn, VIEWS, "v"):
        conn.exec_driver_sql(f"ALTER VIEW public.{name} SET SCHEMA {schema}")
    for signature in FUNCTIONS:
        if conn.execute(text("SELECT to_regprocedure(:f)"),
                        {"f": f"public.{signature}"}).scalar_one() is not None:
            conn.exec_driver_sql(f"ALTER FUNCTION public.{signature} SET SCHEMA {schema}")
    for name in _present(conn, TABLES + VIEWS, "rv", schema):
        conn.exec_driver_sql(f"CREATE VIEW public.{name} AS SELECT * FROM {schema}.{name}")
    conn.exec_driver_sql(f"CREATE TABLE IF NOT EXISTS {schema}.alembic_version "
                         "(version_num varchar(32) NOT NULL, "
                         "CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num))")
    conn.execute(text(f"INSERT INTO {schema}.alembic_version VALUES (:v)"), {"v": revision})
    conn.execute(text("DELETE FROM public.alembic_version WHERE version_num = :v"),
                 {"v": revision})
    if conn.exec_driver_sql("SELECT NOT EXISTS (SELECT FROM public.alembic_version)").scalar():
        conn.exec_driver_sql("DROP TABLE public.alembic_version")


def _present(conn: Connection, names: tuple[str, ...], kinds: str,
             schema: str = "public") -> list[str]:
    """Those of `names` that are relations of one of `kinds` in `schema`, in `names`' order."""
    found = set(conn.execute(text(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = :schema AND c.relkind = ANY(:kinds) AND c.relname = ANY(:names)"),
        {"schema": schema, "kinds": list(kinds), "names": list(names)}).scalars())
    return [n for n in names if n in found]


def compatibility_views(conn: Connection, schema: str) -> list[str]:
    """The views in `public` that stand for this installation's relations: `public.X` defined
    over `schema.X` alone (pg_depend ties each to the relation it reads)."""
    return list(conn.execute(text(
        "SELECT DISTINCT v.relname FROM pg_class v "
        "JOIN pg_namespace vn ON vn.oid = v.relnamespace AND vn.nspname = 'public' "
        "JOIN pg_rewrite r ON r.ev_class = v.oid "
        "JOIN pg_depend d ON d.objid = r.oid AND d.classid = 'pg_rewrite'::regclass "
        "JOIN pg_class t ON t.oid = d.refobjid AND t.relname = v.relname "
        "JOIN pg_namespace tn ON tn.oid = t.relnamespace AND tn.nspname = :schema "
        "WHERE v.relkind = 'v' ORDER BY 1"), {"schema": schema}).scalars())


def finish_move(conn: Connection, schema: str) -> list[str]:
    """Drop the compatibility views the move left in `public`; the names dropped. Run once no
    process of a release before the schema setting is left."""
    with conn.begin():
        conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        names = compatibility_views(conn, schema)
        for name in names:
            conn.exec_driver_sql(f"DROP VIEW public.{name}")
    if names:
        log.info("dropped the compatibility views in public",
                 extra={"action": "migrate", "schema": schema, "views": names})
    return names
