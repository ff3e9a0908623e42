"""One transaction of dependent statements in as few round trips to PostgreSQL as they allow.

The claims and the workflow step's completion run two to five statements in one transaction,
each needing the rows of the one before. Run one after another by psycopg's own transaction
they cost a round trip each plus one for BEGIN and one for COMMIT, and on the path from one
workflow step to the next (or from a limited job's end to the next start) every round trip is
latency a worker's slot waits out. Here the connection is in pipeline mode and autocommit, and
the transaction is written out: BEGIN travels with the first statement, and the last
statement, given as `last=True`, travels with the COMMIT, so two dependent statements take two
round trips instead of four, the rows of each still read before the next is sent.

Invariant: nothing is committed unless the block ends without an error and PostgreSQL accepts
the COMMIT; any error leaves the transaction open on a connection the caller must discard
(Store._driver invalidates it, and PostgreSQL rolls back what it held).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg.rows import namedtuple_row


class Pipelined:
    """`run(sql, params)` for the statements of one open transaction."""

    def __init__(self, driver: psycopg.Connection, pipeline: psycopg.Pipeline,
                 cursor: psycopg.Cursor) -> None:
        self._driver = driver
        self._pipeline = pipeline
        self._cursor = cursor
        self._begun = False
        self.committed = False

    def run(self, sql: str, params: dict[str, Any], *, last: bool = False) -> list:
        """The statement's rows. With `last`, the COMMIT is sent with it and its rows come back
        once the transaction has committed; nothing may run after it."""
        if self.committed:
            raise RuntimeError("the transaction has committed: nothing runs after `last`")
        if not self._begun:
            self._driver.execute(b"BEGIN")
            self._begun = True
        self._cursor.execute(sql, params)
        if last:
            self._driver.execute(b"COMMIT")
            self.committed = True
        # The Sync: PostgreSQL's answer to everything sent so far (an error raises here).
        self._pipeline.sync()
        return self._cursor.fetchall() if self._cursor.description is not None else []

    def commit(self) -> None:
        """Commit, unless the last statement did."""
        if self._begun and not self.committed:
            self._driver.execute(b"COMMIT")
            self._pipeline.sync()
        self.committed = True


@contextlib.contextmanager
def pipelined(driver: psycopg.Connection) -> Iterator[Pipelined]:
    """A transaction on `driver` (a connection outside any transaction), committed when the
    block ends unless its last statement already committed it."""
    driver.autocommit = True
    with driver.pipeline() as pipeline, driver.cursor(row_factory=namedtuple_row) as cursor:
        tx = Pipelined(driver, pipeline, cursor)
        yield tx
        tx.commit()
    driver.autocommit = False
