"""Running taskline's named statements on a connection the application owns.

`taskline.enqueue` writes through the caller's own open connection, inside the caller's
transaction: a SQLAlchemy `Connection` (or an ORM `Session`, through the connection it holds)
or a psycopg 3 `Connection` (Django's `connection.connection`, a psycopg_pool connection).
Nothing here begins, commits or rolls back: the caller's transaction decides.

Invariant: a statement runs on exactly the connection given, in whatever transaction it is in,
and "PostgreSQL is unreachable" surfaces as StoreUnavailable whichever driver said so.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg.rows import namedtuple_row
from sqlalchemy import Connection
from sqlalchemy.orm import Session

from taskline.store.queries import DEFAULT_SCHEMA, queries_for
from taskline.store.store import driver_sql, translate_driver_errors, translate_errors

AppConnection = Connection | Session | psycopg.Connection
"""What the in-transaction enqueue accepts as the caller's connection."""


def run(conn: Any, name: str, params: dict[str, Any], schema: str = DEFAULT_SCHEMA) -> list:
    """The rows statement `name` (for the installation in `schema`) returns, run on `conn`
    inside its open transaction."""
    if isinstance(conn, Session):
        conn = conn.connection()
    if isinstance(conn, Connection):
        with translate_errors():
            return conn.execute(queries_for(schema)[name], params).all()
    if isinstance(conn, psycopg.Connection):
        with translate_driver_errors(conn), conn.cursor(row_factory=namedtuple_row) as cursor:
            return cursor.execute(driver_sql(name, schema), params).fetchall()
    raise TypeError(f"expected a SQLAlchemy Connection or Session or a psycopg 3 Connection, "
                    f"not {type(conn).__name__}")


@contextlib.contextmanager
def savepoint(conn: Any) -> Iterator[None]:
    """A savepoint on `conn` (or a transaction, when it has none open): what runs inside is
    undone alone when it raises, and the caller's transaction goes on."""
    if isinstance(conn, Session):
        conn = conn.connection()
    if isinstance(conn, Connection):
        with translate_errors(), conn.begin_nested():
            yield
    else:
        with translate_driver_errors(conn), conn.transaction():
            yield
