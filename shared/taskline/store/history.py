"""Reads the recorded history for the audit (taskline.audit_verify), page by page.

Invariant: it only reads, and each page of jobs is read in one REPEATABLE READ, READ ONLY
transaction, so a page's jobs, events and leases are one consistent snapshot while the system
runs on (a job is never judged by a row newer than its events); every statement walks an index
for at most one page (jobs by (created_at, id), their events and leases by job, the audit
trail by (at, id), leases by id), so no pass holds more than a page in memory.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Container, Hashable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from psycopg.rows import dict_row
from sqlalchemy import Connection, Engine

from taskline.audit_verify import Page, Setting, settings_over_time
from taskline.store.queries import DEFAULT_SCHEMA, queries_for
from taskline.store.store import driver_sql, translate_driver_errors, translate_errors

FAR_PAST = datetime(1970, 1, 1, tzinfo=UTC)
FAR_FUTURE = datetime(9999, 1, 1, tzinfo=UTC)
NIL = str(uuid.UUID(int=0))
LEASE_PAGE = 10_000


def _id_array(ids: list[str]) -> str:
    """Job ids (canonical text, as the audit's statements select them) as one uuid[] literal:
    cheaper to send than a list the driver adapts element by element."""
    return "{" + ",".join(ids) + "}"


def _by_job(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        out[row["job_id"]].append(row)
    return out


def _grouped(rows: list[tuple[Any, ...]]) -> dict[str, list[tuple[Any, ...]]]:
    """Rows whose first column is a job id, the rest of each grouped by that id, in order."""
    out: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    for row in rows:
        out[row[0]].append(row[1:])
    return out


class HistoryReader:
    """The audit's reader (taskline.audit_verify.Reader) over one installation's tables."""

    def __init__(self, engine: Engine, schema: str = DEFAULT_SCHEMA) -> None:
        self.engine = engine
        self.schema = schema
        self._queries = queries_for(schema)

    def _run(self, conn: Connection, query: str, **params: Any) -> list[Any]:
        return conn.execute(self._queries[query], params).all()

    def _rows(self, conn: Connection, query: str, **params: Any) -> list[dict[str, Any]]:
        """A page statement's rows as plain dicts, straight through psycopg inside `conn`'s
        snapshot: SQLAlchemy's Row for each of a page's thousands of rows cost about as much
        CPU as the audit's rules (docs/performance.md, "Audit verify at scale")."""
        driver = conn.connection.driver_connection
        with translate_driver_errors(driver), driver.cursor(row_factory=dict_row) as cursor:
            return cursor.execute(driver_sql(query, self.schema), params).fetchall()

    def _snapshot(self) -> Any:
        return self.engine.connect().execution_options(
            isolation_level="REPEATABLE READ", postgresql_readonly=True)

    def now(self) -> datetime:
        """PostgreSQL's time, which every recorded instant is in."""
        with translate_errors(), self.engine.connect() as conn:
            return self._run(conn, "database_now")[0].now

    def pages(self, since: datetime | None, size: int,
              known: Container[Hashable] = frozenset()) -> Iterator[Page]:
        """Pages of up to `size` jobs created since `since`, oldest first; a job whose shape is
        in `known` (and that is no workflow step and has no ordering key) comes without its
        events and leases. The next page is read while the caller judges this one (one page
        ahead, so at most two are held)."""
        start = since or FAR_PAST
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="audit-read") as ahead:
            page = self._read(start, (start, NIL), size, known)
            while page.jobs:
                last = page.jobs[-1]
                upcoming = ahead.submit(self._read, start, (last["created_at"], last["id"]),
                                        size, known)
                yield page
                page = upcoming.result()

    def _read(self, since: datetime, after: tuple[datetime, str], size: int,
              known: Container[Hashable]) -> Page:
        with translate_errors(), self._snapshot() as conn, conn.begin():
            return self._page(conn, since, after, size, known)

    def _page(self, conn: Connection, since: datetime, after: tuple[datetime, str],
              size: int, known: Container[Hashable]) -> Page:
        jobs = self._rows(conn, "audit_jobs_page", since=since, after_created=after[0],
                          after_id=after[1], limit=size)
        if not jobs:
            return Page(jobs=[])
        ids = _id_array([job["id"] for job in jobs])
        parents: dict[str, list[str]] = defaultdict(list)
        for row in self._rows(conn, "audit_parents_of", ids=ids):
            parents[row["child_id"]].append(row["parent_id"])
        self._shape(conn, jobs, ids)
        wanted = [job["id"] for job in jobs if job["shape"] not in known
                  or job["ordering_key"] is not None or job["id"] in parents]
        every_parent = sorted({p for ps in parents.values() for p in ps})
        finishes = _by_job(self._rows(conn, "audit_finishes_of", ids=_id_array(every_parent))
                           if every_parent else [])
        if not wanted:
            return Page(jobs=jobs, parents=parents, finishes=finishes)
        ids = _id_array(wanted)
        return Page(jobs=jobs, events=_by_job(self._rows(conn, "audit_events_of", ids=ids)),
                    leases=_by_job(self._rows(conn, "audit_leases_of", ids=ids)),
                    parents=parents, finishes=finishes)

    def _tuples(self, conn: Connection, query: str, **params: Any) -> list[tuple[Any, ...]]:
        """A page statement's rows as tuples (built in psycopg's C code, no dict per row)."""
        driver = conn.connection.driver_connection
        with translate_driver_errors(driver), driver.cursor() as cursor:
            return cursor.execute(driver_sql(query, self.schema), params).fetchall()

    def _shape(self, conn: Connection, jobs: list[dict[str, Any]], ids: str) -> None:
        """Set each job's `shape` (taskline.audit_verify.Page): its status, attempts and what
        the rules about one job read of its events and leases, in order; None for a job with
        more than one lease (whose leases' times those rules compare)."""
        events = _grouped(self._tuples(conn, "audit_event_shapes_of", ids=ids))
        leases = _grouped(self._tuples(conn, "audit_lease_shapes_of", ids=ids))
        for job in jobs:
            mine = leases.get(job["id"], ())
            job["shape"] = None if len(mine) > 1 else (
                job["status"], job["attempts"], tuple(events.get(job["id"], ())), tuple(mine))

    def limit_settings(self, since: datetime | None) -> list[Setting]:
        """Every flow limit setting in force at some time since `since`."""
        with translate_errors(), self.engine.connect() as conn:
            changes = list(self._changes(conn))
            current = [dict(r._mapping) for r in self._run(conn, "audit_flow_limits")]
        settings = settings_over_time(changes, current)
        return [s for s in settings if since is None or s.end is None or s.end > since]

    def _changes(self, conn: Connection, size: int = 1000) -> Iterator[Mapping[str, Any]]:
        after: tuple[datetime, str] = (FAR_PAST, NIL)
        while True:
            rows = self._run(conn, "audit_limit_changes", after_at=after[0], after_id=after[1],
                             limit=size)
            yield from (dict(r._mapping) for r in rows)
            if len(rows) < size:
                return
            after = (rows[-1].at, str(rows[-1].id))

    def scope_leases(self, setting: Setting) -> Iterator[Mapping[str, Any]]:
        """The leases of the setting's scope open at some time while it was in force."""
        kind, name = setting.scope.split(":", 1)
        after = 0
        while True:
            with translate_errors(), self.engine.connect() as conn:
                rows = self._run(conn, "audit_scope_leases", after=after, kind=kind, name=name,
                                 start=setting.start, end=setting.end or FAR_FUTURE,
                                 limit=LEASE_PAGE)
            yield from (dict(r._mapping) for r in rows)
            if len(rows) < LEASE_PAGE:
                return
            after = rows[-1].id
