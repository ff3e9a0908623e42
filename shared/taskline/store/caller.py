"""Running taskline's named statements on a connection the application owns, sync or async.

`taskline.enqueue` writes through the caller's own open connection, inside the caller's
transaction: a SQLAlchemy `Connection`, ORM `Session` or `scoped_session` (Flask-SQLAlchemy's
`db.session`), or a psycopg 3 `Connection` (Django's `connection.connection`, a psycopg_pool
connection); `taskline.aenqueue` likewise on a psycopg `AsyncConnection` or a SQLAlchemy
`AsyncConnection`, `AsyncSession` or `async_scoped_session`. Nothing here begins, commits or
rolls back: the caller's transaction decides.

A write is prepared once, as a plan: a generator that yields the Statements it needs and
receives each one's rows (sans I/O). `drive` runs a plan on a sync connection and `adrive` on an
async one, so validation, idempotency and the outbox are the same code whichever the caller.

Invariant: a statement runs on exactly the connection given, in whatever transaction it is in,
and "PostgreSQL is unreachable" surfaces as StoreUnavailable whichever driver said so.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator, Generator, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

import psycopg
from psycopg.rows import namedtuple_row
from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session, scoped_session

from taskline.store.queries import DEFAULT_SCHEMA, queries_for
from taskline.store.store import (
    driver_sql,
    has_rows,
    translate_driver_errors,
    translate_errors,
)

AppConnection = Connection | Session | scoped_session | psycopg.Connection
"""What the in-transaction enqueue accepts as the caller's connection."""
AsyncAppConnection = Any
"""What `aenqueue` accepts: psycopg's AsyncConnection, or SQLAlchemy's AsyncConnection,
AsyncSession or async_scoped_session (typed loosely: SQLAlchemy's asyncio extension is imported
only by an application that uses it)."""

SYNC_ACCEPTED = ("a SQLAlchemy Connection, Session or scoped_session, "
                 "or a psycopg 3 Connection")
ASYNC_ACCEPTED = ("a psycopg 3 AsyncConnection, or a SQLAlchemy AsyncConnection, "
                  "AsyncSession or async_scoped_session")

T = TypeVar("T")


@dataclass(frozen=True)
class Statement:
    """One named statement a plan needs run, with its parameters."""

    name: str
    params: dict[str, Any]


Plan = Generator[Statement, list, T]
"""A write prepared without I/O: yields Statements, receives their rows, returns its result."""


def drive(conn: Any, plan: Plan[T], schema: str = DEFAULT_SCHEMA) -> T:
    """Run `plan` on the sync connection `conn`; what the plan returns."""
    target = sync_target(conn)
    rows: list | None = None
    while True:
        try:
            statement = plan.send(rows)  # type: ignore[arg-type]
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        rows = _execute(target, statement.name, statement.params, schema)


async def adrive(conn: Any, plan: Plan[T], schema: str = DEFAULT_SCHEMA) -> T:
    """Run `plan` on the async connection `conn`; what the plan returns."""
    target = await async_target(conn)
    rows: list | None = None
    while True:
        try:
            statement = plan.send(rows)  # type: ignore[arg-type]
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        rows = await _aexecute(target, statement.name, statement.params, schema)


def run(conn: Any, name: str, params: dict[str, Any], schema: str = DEFAULT_SCHEMA) -> list:
    """The rows statement `name` (for the installation in `schema`) returns, run on `conn`
    inside its open transaction ([] for a statement without rows)."""
    return _execute(sync_target(conn), name, params, schema)


async def arun(conn: Any, name: str, params: dict[str, Any],
               schema: str = DEFAULT_SCHEMA) -> list:
    """`run` on an async connection."""
    return await _aexecute(await async_target(conn), name, params, schema)


def execute(target: Connection | psycopg.Connection, statement: Statement,
            schema: str = DEFAULT_SCHEMA) -> list:
    """`statement`'s rows, run on `target` (what `sync_target` gave): one statement of a plan
    run without driving the plan, for a write whose steps are known in advance
    (taskline.enqueuing's plain job)."""
    return _execute(target, statement.name, statement.params, schema)


def sync_target(conn: Any) -> Connection | psycopg.Connection:
    """The connection a sync caller's object runs statements on; TypeError naming what is
    accepted when it is none of them."""
    if isinstance(conn, scoped_session):
        conn = conn()  # the session of this thread (or Flask app context)
    if isinstance(conn, Session):
        conn = conn.connection()
    if isinstance(conn, Connection | psycopg.Connection):
        return conn
    hint = " (an async connection: use the `a...` function, e.g. aenqueue)" if _is_async(
        conn) else ""
    raise TypeError(f"expected {SYNC_ACCEPTED}, not {type(conn).__name__}{hint}")


async def async_target(conn: Any) -> Any:
    """The psycopg or SQLAlchemy AsyncConnection an async caller's object runs statements on;
    TypeError naming what is accepted when it is none of them."""
    if isinstance(conn, psycopg.AsyncConnection):
        return conn
    sa_async = sys.modules.get("sqlalchemy.ext.asyncio")
    if sa_async is not None:
        if isinstance(conn, sa_async.async_scoped_session):
            conn = conn()
        if isinstance(conn, sa_async.AsyncSession):
            conn = await conn.connection()
        if isinstance(conn, sa_async.AsyncConnection):
            return conn
    hint = (" (a sync connection: use enqueue, enqueue_many or submit_workflow)"
            if isinstance(conn, Connection | Session | scoped_session | psycopg.Connection)
            else "")
    raise TypeError(f"expected {ASYNC_ACCEPTED}, not {type(conn).__name__}{hint}")


def _is_async(conn: Any) -> bool:
    if isinstance(conn, psycopg.AsyncConnection):
        return True
    sa_async = sys.modules.get("sqlalchemy.ext.asyncio")
    return sa_async is not None and isinstance(conn, sa_async.AsyncConnection
                                               | sa_async.AsyncSession
                                               | sa_async.async_scoped_session)


def _execute(conn: Connection | psycopg.Connection, name: str, params: dict[str, Any],
             schema: str) -> list:
    if isinstance(conn, Connection):
        with translate_errors():
            if conn.dialect.driver == "psycopg":
                # The statement as psycopg takes it, as Store._run_on_driver runs it, but through
                # the Connection (its events, errors and transaction as for any statement):
                # compiling the text() per call cost about a tenth of the call's Python.
                result = conn.exec_driver_sql(driver_sql(name, schema), params)
            else:
                result = conn.execute(queries_for(schema)[name], params)
            return result.all() if result.returns_rows else []
    with translate_driver_errors(conn), conn.cursor(row_factory=namedtuple_row) as cursor:
        cursor.execute(driver_sql(name, schema), params)
        return cursor.fetchall() if has_rows(cursor) else []


async def _aexecute(conn: Any, name: str, params: dict[str, Any], schema: str) -> list:
    if isinstance(conn, psycopg.AsyncConnection):
        with translate_driver_errors(conn):  # type: ignore[arg-type]
            async with conn.cursor(row_factory=namedtuple_row) as cursor:
                await cursor.execute(driver_sql(name, schema), params)
                return await cursor.fetchall() if has_rows(cursor) else []
    with translate_errors():
        result = await conn.execute(queries_for(schema)[name], params)
        return result.all() if result.returns_rows else []


@contextlib.contextmanager
def savepoint(conn: Any) -> Iterator[None]:
    """A savepoint on `conn` (or a transaction, when it has none open): what runs inside is
    undone alone when it raises, and the caller's transaction goes on."""
    target = sync_target(conn)
    if isinstance(target, Connection):
        with translate_errors(), target.begin_nested():
            yield
    else:
        with translate_driver_errors(target), target.transaction():
            yield


@contextlib.asynccontextmanager
async def asavepoint(conn: Any) -> AsyncIterator[None]:
    """`savepoint` on an async connection."""
    target = await async_target(conn)
    if isinstance(target, psycopg.AsyncConnection):
        with translate_driver_errors(target):  # type: ignore[arg-type]
            async with target.transaction():
                yield
    else:
        with translate_errors():
            async with target.begin_nested():
                yield


def database_url(conn_or_url: Any) -> str:
    """The libpq URL of the database `conn_or_url` names or is connected to."""
    if isinstance(conn_or_url, str):
        return conn_or_url
    url = getattr(conn_or_url, "url", None)
    if isinstance(url, str):  # the taskline_db fixture
        return url
    engine = _engine_of(conn_or_url)
    if engine is not None:
        return engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    info = getattr(conn_or_url, "info", None)
    if info is not None and hasattr(info, "get_parameters"):  # a psycopg connection
        params = info.get_parameters()
        password = f":{quote(info.password, safe='')}" if info.password else ""
        return (f"postgresql://{quote(params.get('user', ''), safe='')}{password}@"
                f"{info.host}:{info.port}/{quote(params.get('dbname', ''), safe='')}")
    raise TypeError("expected a database URL, the taskline_db fixture, a SQLAlchemy "
                    f"Engine, Connection or Session, or a psycopg Connection; not "
                    f"{type(conn_or_url).__name__}")


def _engine_of(conn: Any) -> Any:
    if isinstance(conn, scoped_session):
        conn = conn()
    if isinstance(conn, Session):
        return conn.get_bind()
    if isinstance(conn, Connection):
        return conn.engine
    return conn if isinstance(conn, Engine) else None
