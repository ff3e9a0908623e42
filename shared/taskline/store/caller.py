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
import functools
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg.rows import namedtuple_row
from sqlalchemy import Connection
from sqlalchemy.dialects.postgresql import psycopg as sqlalchemy_psycopg
from sqlalchemy.orm import Session

from taskline.errors import StoreUnavailable
from taskline.store.queries import load_queries
from taskline.store.store import translate_errors

_QUERIES = load_queries()
_UNREACHABLE = (psycopg.OperationalError, psycopg.InterfaceError)

AppConnection = Connection | Session | psycopg.Connection
"""What the in-transaction enqueue accepts as the caller's connection."""


@functools.cache
def _psycopg_sql(name: str) -> str:
    return str(_QUERIES[name].compile(dialect=sqlalchemy_psycopg.dialect()))


def run(conn: Any, name: str, params: dict[str, Any]) -> list:
    """The rows statement `name` returns, run on `conn` inside its open transaction."""
    if isinstance(conn, Session):
        conn = conn.connection()
    if isinstance(conn, Connection):
        with translate_errors():
            return conn.execute(_QUERIES[name], params).all()
    if isinstance(conn, psycopg.Connection):
        with _translate(conn), conn.cursor(row_factory=namedtuple_row) as cursor:
            return cursor.execute(_psycopg_sql(name), params).fetchall()
    raise TypeError(f"expected a SQLAlchemy Connection or Session or a psycopg 3 Connection, "
                    f"not {type(conn).__name__}")


@contextlib.contextmanager
def _translate(conn: psycopg.Connection) -> Iterator[None]:
    try:
        yield
    except psycopg.Error as err:
        if isinstance(err, _UNREACHABLE) or conn.broken:
            raise StoreUnavailable(f"PostgreSQL unavailable: {type(err).__name__}") from err
        raise


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
        with _translate(conn), conn.transaction():
            yield
