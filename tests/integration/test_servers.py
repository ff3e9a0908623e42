"""The private test servers: they start, answer, die when killed, and come back the way a
real restart would (PostgreSQL keeps committed data, Redis comes back empty)."""

from __future__ import annotations

import socket

import psycopg
import pytest
import redis
from sqlalchemy import create_engine, inspect

from taskline.store.store import sqlalchemy_url
from taskline_cli.localservers import group_alive, redis_answers
from tests.servers import (
    PrivatePostgres,
    PrivateRedis,
    ServerError,
    new_database,
    ready,
    scratch_dir,
)

pytestmark = pytest.mark.slow


def _query(url: str, statement: str) -> list[tuple]:
    with psycopg.connect(url, connect_timeout=3, autocommit=True) as conn:
        cur = conn.execute(statement)
        return cur.fetchall() if cur.description else []


def test_redis_restart_comes_back_empty_on_the_same_url(fresh_redis: PrivateRedis):
    url = fresh_redis.url
    redis.Redis.from_url(url).set("k", "v")
    first_pid = fresh_redis.pid
    fresh_redis.restart()
    assert fresh_redis.url == url
    assert fresh_redis.pid != first_pid
    assert redis.Redis.from_url(url).get("k") is None


def test_redis_kill_takes_it_down_and_start_brings_it_back(fresh_redis: PrivateRedis):
    pid = fresh_redis.pid
    fresh_redis.kill()
    assert not fresh_redis.running
    assert not group_alive(pid)
    assert not redis_answers(fresh_redis.url)
    fresh_redis.start()
    assert redis_answers(fresh_redis.url)


def test_frozen_redis_accepts_nothing_until_thawed(fresh_redis: PrivateRedis):
    fresh_redis.freeze()
    try:
        assert not redis_answers(fresh_redis.url, timeout=0.3)
    finally:
        fresh_redis.thaw()
    assert redis_answers(fresh_redis.url)


def test_flushall_empties_the_private_redis_only(private_redis: PrivateRedis):
    client = redis.Redis.from_url(private_redis.url)
    client.set("a", 1)
    private_redis.flushall()
    assert client.dbsize() == 0


def test_ready_restarts_a_killed_server_and_thaws_a_frozen_one(private_redis: PrivateRedis):
    private_redis.kill()
    ready(private_redis)
    assert redis_answers(private_redis.url)
    private_redis.freeze()
    ready(private_redis)
    assert redis_answers(private_redis.url)


def test_postgres_keeps_committed_data_across_a_restart(fresh_postgres: PrivatePostgres):
    url = new_database(fresh_postgres)
    _query(url, "CREATE TABLE kept (v int); INSERT INTO kept VALUES (42)")
    fresh_postgres.restart()
    assert _query(url, "SELECT v FROM kept") == [(42,)]


def test_postgres_crash_kills_every_backend_and_recovers(fresh_postgres: PrivatePostgres):
    url = new_database(fresh_postgres)
    _query(url, "CREATE TABLE kept (v int); INSERT INTO kept VALUES (7)")
    held = psycopg.connect(url)  # a live backend the crash must take down too
    pid = fresh_postgres.pid
    fresh_postgres.crash()
    assert not group_alive(pid)
    with pytest.raises(psycopg.OperationalError):
        _query(url, "SELECT 1")
    fresh_postgres.start()
    assert _query(url, "SELECT v FROM kept") == [(7,)]
    held.close()


def test_a_frozen_postgres_can_be_crashed_and_restarted(fresh_postgres: PrivatePostgres):
    url = new_database(fresh_postgres)
    held = psycopg.connect(url)
    fresh_postgres.freeze()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=1)
    pid = fresh_postgres.pid
    fresh_postgres.crash()
    assert not group_alive(pid)
    fresh_postgres.start()
    assert _query(url, "SELECT count(*) FROM taskline.jobs") == [(0,)]
    held.close()


def test_new_database_is_migrated(private_postgres: PrivatePostgres):
    url = new_database(private_postgres)
    tables = set(inspect(create_engine(sqlalchemy_url(url))).get_table_names(schema="taskline"))
    assert {"jobs", "job_leases", "job_events", "dead_letter_jobs", "workers"} <= tables


def test_ready_restarts_a_crashed_postgres_with_its_data(private_postgres: PrivatePostgres):
    url = new_database(private_postgres)
    private_postgres.crash()
    ready(private_postgres)
    assert _query(url, "SELECT count(*) FROM taskline.jobs") == [(0,)]


def test_a_taken_port_fails_with_the_server_log():
    with socket.socket() as taken, scratch_dir("taskline-redis-") as root:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = PrivateRedis(root / "r", port=taken.getsockname()[1])
        with pytest.raises(ServerError, match="did not start"):
            server.start(timeout=10)
        assert not server.running
