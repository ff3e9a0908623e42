"""The pipelined transaction (taskline.store.pipelined) against real PostgreSQL: each statement
sees the rows of the one before, the last travels with the COMMIT, and nothing commits when a
statement fails or the block raises."""

from __future__ import annotations

import psycopg
import pytest

from taskline.store.pipelined import pipelined


@pytest.fixture
def conn(database_url: str):
    setup = psycopg.connect(database_url, autocommit=True)
    setup.execute("CREATE TABLE piped (x int PRIMARY KEY)")
    setup.close()
    driver = psycopg.connect(database_url)
    yield driver
    driver.close()


def kept(database_url: str) -> list[int]:
    with psycopg.connect(database_url, autocommit=True) as other:
        return [r[0] for r in other.execute("SELECT x FROM piped ORDER BY x")]


def test_statements_see_each_other_and_commit_with_the_last(conn, database_url):
    with pipelined(conn) as tx:
        first = tx.run("INSERT INTO piped VALUES (%(x)s) RETURNING x", {"x": 1})
        none = tx.run("INSERT INTO piped VALUES (%(x)s)", {"x": first[0].x + 1})
        assert kept(database_url) == []  # not committed before the last statement
        counted = tx.run("SELECT count(*) AS n FROM piped", {}, last=True)
        assert kept(database_url) == [1, 2]  # committed with it, inside the block
    assert (first[0].x, none, counted[0].n) == (1, [], 2)


def test_a_block_without_a_last_statement_commits_when_it_ends(conn, database_url):
    with pipelined(conn) as tx:
        tx.run("INSERT INTO piped VALUES (%(x)s)", {"x": 7})
        assert kept(database_url) == []
    assert kept(database_url) == [7]


def test_a_failing_statement_commits_nothing(conn, database_url):
    with pytest.raises(psycopg.errors.UniqueViolation), pipelined(conn) as tx:
        tx.run("INSERT INTO piped VALUES (%(x)s)", {"x": 3})
        tx.run("INSERT INTO piped VALUES (%(x)s)", {"x": 3}, last=True)
    conn.close()  # as Store._driver discards it
    assert kept(database_url) == []


def test_a_block_that_raises_commits_nothing(conn, database_url):
    with pytest.raises(ValueError), pipelined(conn) as tx:
        tx.run("INSERT INTO piped VALUES (%(x)s)", {"x": 4})
        raise ValueError("the caller changed its mind")
    conn.close()
    assert kept(database_url) == []


def test_nothing_runs_after_the_last_statement(conn, database_url):
    with pipelined(conn) as tx:
        tx.run("INSERT INTO piped VALUES (%(x)s)", {"x": 5}, last=True)
        with pytest.raises(RuntimeError):
            tx.run("INSERT INTO piped VALUES (%(x)s)", {"x": 6})
    assert kept(database_url) == [5]
