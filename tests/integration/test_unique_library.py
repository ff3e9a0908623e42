"""Unique jobs and debounce through the library (`taskline.enqueue` / `aenqueue` /
`enqueue_many`) on real PostgreSQL: duplicates return the existing job's id, replace rewrites
a job that has not started and refuses one that has, debounce arrivals join the waiting job,
and a batch holding one keyed job stays all or none."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import Engine, create_engine, text

import taskline
from taskline.errors import AlreadyStarted, InvalidJob
from taskline.settings import Settings
from taskline.store.store import Store, sqlalchemy_url
from taskline.uniquespec import MAX_COALESCED


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    eng = create_engine(sqlalchemy_url(database_url))
    yield eng
    eng.dispose()


def _count(engine: Engine, where: str = "true") -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(f"SELECT count(*) FROM taskline.jobs WHERE {where}"))
                   .scalar_one())


def test_unique_duplicate_returns_the_first_job(engine: Engine, store: Store) -> None:
    with engine.begin() as conn:
        first = taskline.enqueue(conn, "echo", {"a": 1}, unique={"key": "k"})
        again = taskline.enqueue(conn, "echo", {"a": 2}, unique={"key": "k"})
    with engine.begin() as conn:
        later = taskline.enqueue(conn, "echo", {"a": 3}, unique={"key": "k"})
        other_queue = taskline.enqueue(conn, "echo", {"a": 3}, queue="q2", unique={"key": "k"})
    assert first == again == later != other_queue
    job = store.get_job(first)
    assert job.payload == {"a": 1} and job.unique_key == "k"
    assert _count(engine) == 2


def test_default_key_is_type_and_payload(engine: Engine) -> None:
    with engine.begin() as conn:
        a = taskline.enqueue(conn, "echo", {"x": 1, "y": 2}, unique={})
        b = taskline.enqueue(conn, "echo", {"y": 2, "x": 1}, unique={})
        c = taskline.enqueue(conn, "echo", {"x": 2}, unique={})
        d = taskline.enqueue(conn, "other", {"x": 1, "y": 2}, unique={})
    assert a == b and len({a, c, d}) == 3


def test_states_scope_and_period(engine: Engine, store: Store) -> None:
    with engine.begin() as conn:
        first = taskline.enqueue(conn, "echo", unique={"key": "s", "states": ["queued"]})
        conn.execute(text("UPDATE taskline.jobs SET status = 'succeeded' WHERE id = :id"),
                     {"id": first})
        # Out of scope (succeeded): a new job; in scope when the scope names it.
        second = taskline.enqueue(conn, "echo", unique={"key": "s", "states": ["queued"]})
        third = taskline.enqueue(conn, "echo", unique={"key": "s", "states": ["succeeded"]})
        conn.execute(text("UPDATE taskline.jobs SET created_at = now() - interval '1 hour' "
                          "WHERE id = :id"), {"id": second})
        fourth = taskline.enqueue(conn, "echo", unique={"key": "s", "period_s": 60})
        fifth = taskline.enqueue(conn, "echo", unique={"key": "s", "period_s": 7200})
    assert second != first and third == first
    assert fourth not in (first, second)
    assert fifth == fourth  # the newest in scope


def test_replace_until_started(engine: Engine, store: Store) -> None:
    with engine.begin() as conn:
        job_id = taskline.enqueue(conn, "echo", {"v": 1}, delay_s=60,
                                  unique={"key": "r", "on_conflict": "replace"})
        same = taskline.enqueue(conn, "echo", {"v": 2}, priority=9, delay_s=120,
                                unique={"key": "r", "on_conflict": "replace"})
    assert same == job_id
    job = store.get_job(job_id)
    assert (job.payload, job.priority, job.status) == ({"v": 2}, 9, "scheduled")
    assert [e["event"] for e in store.get_history(job_id)[0]] == ["scheduled", "replaced"]
    with engine.begin() as conn:
        conn.execute(text("UPDATE taskline.jobs SET status = 'running', attempts = 1 "
                          "WHERE id = :id"), {"id": job_id})
    with engine.begin() as conn, pytest.raises(AlreadyStarted):
        taskline.enqueue(conn, "echo", {"v": 3}, unique={"key": "r", "on_conflict": "replace"})
    assert store.get_job(job_id).payload == {"v": 2}


def test_debounce_joins_the_waiting_job(engine: Engine, store: Store) -> None:
    with engine.begin() as conn:
        ids = [taskline.enqueue(conn, "digest", {"n": n}, debounce={"key": "d", "delay_s": 30})
               for n in range(5)]
        other_type = taskline.enqueue(conn, "other", {"n": 9},
                                      debounce={"key": "d", "delay_s": 30})
    assert len(set(ids)) == 1 and other_type != ids[0]
    job = store.get_job(ids[0])
    assert job.payload == {"n": 0} and job.status == "scheduled"
    assert job.coalesced == [{"n": n} for n in range(5)]
    events = [e["event"] for e in store.get_history(ids[0])[0]]
    assert events == ["scheduled"] + ["joined"] * 4


def test_debounce_after_start_begins_a_new_job(engine: Engine, store: Store) -> None:
    with engine.begin() as conn:
        first = taskline.enqueue(conn, "digest", {"n": 1}, debounce={"key": "d", "delay_s": 5})
        conn.execute(text("UPDATE taskline.jobs SET status = 'queued' WHERE id = :id"),
                     {"id": first})
        second = taskline.enqueue(conn, "digest", {"n": 2}, debounce={"key": "d", "delay_s": 5})
    assert second != first
    assert store.get_job(first).coalesced == [{"n": 1}]
    assert store.get_job(second).coalesced == [{"n": 2}]


def test_debounce_is_bounded(engine: Engine, store: Store) -> None:
    with engine.begin() as conn:
        ids = taskline.enqueue_many(conn, [
            {"type": "digest", "payload": n, "debounce": {"key": "b", "delay_s": 5}}
            for n in range(MAX_COALESCED)])
        ids.append(taskline.enqueue(conn, "digest", MAX_COALESCED,
                                    debounce={"key": "b", "delay_s": 5}))
    assert len(set(ids[:MAX_COALESCED])) == 1 and ids[MAX_COALESCED] != ids[0]
    assert store.get_job(ids[0]).coalesced == list(range(MAX_COALESCED))
    # The payload size limit bounds the payloads' bytes too.
    small = Settings(max_payload_bytes=1024)
    with engine.begin() as conn:
        big = [taskline.enqueue(conn, "digest", "x" * 400, settings=small,
                                debounce={"key": "big", "delay_s": 5}) for _ in range(3)]
    assert big[0] == big[1] != big[2]


def test_debounce_run_time_is_capped(engine: Engine, store: Store) -> None:
    with engine.begin() as conn:
        job_id = taskline.enqueue(conn, "digest", 1, debounce={"key": "c", "delay_s": 10})
        conn.execute(text("UPDATE taskline.jobs SET created_at = now() - interval '95 s' "
                          "WHERE id = :id"), {"id": job_id})
        taskline.enqueue(conn, "digest", 2, debounce={"key": "c", "delay_s": 10})
        lag = conn.execute(text("SELECT extract(epoch FROM next_run_at - now()) "
                                "FROM taskline.jobs WHERE id = :id"), {"id": job_id}).scalar_one()
    assert 4 <= float(lag) <= 5.5  # 10 x delay_s after its creation, not 10 s from now


def test_refused_batch_writes_nothing(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE marks (id int)"))
        conn.execute(text("INSERT INTO marks VALUES (1)"))
        with pytest.raises(taskline.IdempotencyConflict):
            taskline.enqueue_many(conn, [
                {"type": "echo", "unique": {"key": "u1"}},
                {"type": "echo", "idempotency_key": "i1"},
                {"type": "echo", "payload": 2, "idempotency_key": "i1"}])
        assert conn.execute(text("SELECT count(*) FROM marks")).scalar_one() == 1
    assert _count(engine) == 0


@pytest.mark.parametrize("fields, field", [
    ({"unique": {"states": ["queued", "nope"]}}, "unique.states[1]"),
    ({"unique": {"period_s": -1}}, "unique.period_s"),
    ({"unique": {"on_conflict": "merge"}}, "unique.on_conflict"),
    ({"debounce": {"key": "k", "delay_s": 1}, "unique": {}}, "debounce"),
    ({"debounce": {"key": "k", "delay_s": 1}, "idempotency_key": "x"}, "debounce"),
    ({"debounce": {"key": "k", "delay_s": -1}}, "debounce.delay_s"),
    ({"debounce": {"delay_s": 1}}, "debounce.key"),
])
def test_bad_input_names_the_field(engine: Engine, fields: dict, field: str) -> None:
    with engine.begin() as conn, pytest.raises(InvalidJob) as raised:
        taskline.enqueue(conn, "echo", **fields)
    assert field in [e["field"] for e in raised.value.errors]
    assert _count(engine) == 0


def test_aenqueue_unique_and_debounce(database_url: str, store: Store) -> None:
    async def body() -> tuple:
        conn = await psycopg.AsyncConnection.connect(database_url)
        async with conn, conn.transaction():
            a = await taskline.aenqueue(conn, "echo", 1, unique={"key": "x"})
            b = await taskline.aenqueue(conn, "echo", 2, unique={"key": "x"})
            c = await taskline.aenqueue(conn, "digest", 1, debounce={"key": "y", "delay_s": 9})
            d = await taskline.aenqueue(conn, "digest", 2, debounce={"key": "y", "delay_s": 9})
            many = await taskline.aenqueue_many(
                conn, [{"type": "echo", "unique": {"key": "x"}}, {"type": "echo"}])
        return a, b, c, d, many

    a, b, c, d, many = asyncio.run(body())
    assert a == b == many[0] and c == d != many[1]
    assert store.get_job(c).coalesced == [1, 2]


@pytest.mark.parametrize("field", ["unique", "debounce"])
def test_workflow_step_with_either_is_refused(engine: Engine, field: str) -> None:
    value = {"key": "k", "delay_s": 1} if field == "debounce" else {}
    with engine.begin() as conn, pytest.raises(InvalidJob) as raised:
        taskline.submit_workflow(conn, "w", [{"id": "a", "job": {"type": "t", field: value}}])
    assert raised.value.errors[0]["field"] == f"steps.a.job.{field}"
    assert _count(engine) == 0


def test_replacing_a_queued_job_owes_it_to_its_new_priority(engine: Engine) -> None:
    unique = {"key": "q", "on_conflict": "replace"}
    with engine.begin() as conn:
        job_id = taskline.enqueue(conn, "echo", 1, unique=unique)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM taskline.enqueue_outbox"))  # relayed meanwhile
    with engine.begin() as conn:
        assert taskline.enqueue(conn, "echo", 2, priority=9, unique=unique) == job_id
        owed = conn.execute(text("SELECT job_id FROM taskline.enqueue_outbox")).scalars().all()
    assert owed == [job_id]
