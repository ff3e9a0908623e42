"""`taskline.enqueue` / `enqueue_many` / `submit_workflow` on a SQLAlchemy `scoped_session`
(Flask-SQLAlchemy's `db.session`), and `aenqueue` / `aenqueue_many` / `asubmit_workflow` on
psycopg's AsyncConnection and SQLAlchemy's AsyncConnection and AsyncSession (real PostgreSQL).

Each kind of session is tested with commit and rollback: the job (or workflow) exists exactly
when the caller commits, with its outbox row; validation, idempotency keys and the batch's
savepoint behave as on the sync calls; a wrong object is a TypeError naming what is accepted.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_scoped_session,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import scoped_session, sessionmaker

import taskline
from taskline.errors import IdempotencyConflict, InvalidJob
from taskline.settings import Settings
from taskline.store.store import Store, sqlalchemy_url

STEPS = [{"id": "a", "job": {"type": "echo"}},
         {"id": "b", "job": {"type": "echo"}, "after": ["a"]}]


def async_url(database_url: str) -> str:
    return sqlalchemy_url(database_url).replace("+psycopg://", "+psycopg_async://")


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    eng = create_engine(sqlalchemy_url(database_url))
    yield eng
    eng.dispose()


def run_async(database_url: str, body: Callable[[AsyncEngine], Awaitable[Any]]) -> Any:
    """Run `body` on a fresh event loop with an async engine it may use."""
    async def main() -> Any:
        eng = create_async_engine(async_url(database_url))
        try:
            return await body(eng)
        finally:
            await eng.dispose()
    return asyncio.run(main())


def outbox(store: Store) -> list[uuid.UUID]:
    with store.transaction() as conn:
        return [r.job_id for r in conn.execute(text("SELECT job_id FROM taskline.enqueue_outbox"))]


def workflow_count(store: Store) -> int:
    with store.transaction() as conn:
        return conn.execute(text("SELECT count(*) FROM taskline.workflows")).scalar_one()


# --- scoped_session (Flask-SQLAlchemy's db.session) ------------------------------------------

def test_scoped_session_commits_and_rolls_back(engine: Engine, store: Store) -> None:
    session = scoped_session(sessionmaker(engine))
    kept = taskline.enqueue(session, "echo", {"n": 1}, queue="mail")
    batch = taskline.enqueue_many(session, [{"type": "echo", "idempotency_key": "k1"},
                                            {"type": "echo", "idempotency_key": "k2"}])
    workflow = taskline.submit_workflow(session, "wf", STEPS)
    session.commit()
    dropped = taskline.enqueue(session, "echo")
    session.rollback()
    session.remove()
    assert store.get_job(kept).queue == "mail"
    assert all(store.get_job(i) is not None for i in batch)
    assert store.get_job(dropped) is None
    assert store.get_workflow(workflow) is not None
    assert len(outbox(store)) == 4  # kept, the batch and the workflow's first step


def test_flask_sqlalchemy_db_session(database_url: str, store: Store) -> None:
    from flask import Flask
    from flask_sqlalchemy import SQLAlchemy

    app = Flask("shop")
    app.config["SQLALCHEMY_DATABASE_URI"] = sqlalchemy_url(database_url)
    db = SQLAlchemy(app)
    with app.app_context():
        committed = taskline.enqueue(db.session, "echo", idempotency_key="receipt:1")
        db.session.commit()
        assert taskline.enqueue(db.session, "echo", idempotency_key="receipt:1") == committed
        rolled_back = taskline.enqueue(db.session, "echo")
        db.session.rollback()
        db.engine.dispose()
    assert store.get_job(committed) is not None
    assert store.get_job(rolled_back) is None


# --- psycopg AsyncConnection -----------------------------------------------------------------

def test_psycopg_async_connection_commit_and_rollback(database_url: str, store: Store) -> None:
    async def body() -> tuple[uuid.UUID, list[uuid.UUID], uuid.UUID]:
        async with await psycopg.AsyncConnection.connect(database_url) as conn:
            kept = await taskline.aenqueue(conn, "echo", {"a": 1}, priority="high")
            batch = await taskline.aenqueue_many(conn, [{"type": "echo", "delay_s": 60},
                                                        {"type": "echo", "queue": "b"}])
            await conn.commit()
            dropped = await taskline.aenqueue(conn, "echo")
            await conn.rollback()
            return kept, batch, dropped
    kept, batch, dropped = asyncio.run(body())
    assert (store.get_job(kept).priority, store.get_job(kept).payload) == (7, {"a": 1})
    assert [store.get_job(i).status for i in batch] == ["scheduled", "queued"]
    assert store.get_job(dropped) is None
    assert sorted(outbox(store)) == sorted([kept, *batch])


def test_psycopg_async_workflow_and_notify_at_commit(database_url: str, store: Store) -> None:
    async def body() -> tuple[uuid.UUID, list[str]]:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as ear, \
                await psycopg.AsyncConnection.connect(database_url) as conn:
            await ear.execute("LISTEN taskline_enqueued")
            workflow = await taskline.asubmit_workflow(conn, "wf", STEPS, idempotency_key="w")
            await conn.commit()
            heard = [n.payload async for n in ear.notifies(timeout=2, stop_after=1)]
            assert await taskline.asubmit_workflow(conn, "wf", STEPS,
                                                   idempotency_key="w") == workflow
            await conn.commit()
            return workflow, heard
    workflow, heard = asyncio.run(body())
    assert heard == ["default"]
    assert workflow_count(store) == 1  # the replay found the first one
    with store.transaction() as conn:
        steps = dict(conn.execute(text("SELECT step, status FROM taskline.jobs"
                                       " WHERE workflow_id = :w"), {"w": workflow}).all())
    assert steps == {"a": "queued", "b": "waiting"}
    assert len(outbox(store)) == 1  # step a; b waits for it


# --- SQLAlchemy AsyncConnection and AsyncSession ---------------------------------------------

def test_sqlalchemy_async_connection_commit_and_rollback(database_url: str,
                                                         store: Store) -> None:
    async def body(eng: AsyncEngine) -> tuple[uuid.UUID, uuid.UUID, uuid.UUID]:
        async with eng.connect() as conn:
            kept = await taskline.aenqueue(conn, "echo", queue="mail")
            workflow = await taskline.asubmit_workflow(conn, "wf", STEPS)
            await conn.commit()
            dropped = await taskline.aenqueue(conn, "echo")
            await conn.rollback()
            return kept, workflow, dropped
    kept, workflow, dropped = run_async(database_url, body)
    assert store.get_job(kept).queue == "mail"
    assert store.get_workflow(workflow) is not None
    assert store.get_job(dropped) is None
    assert len(outbox(store)) == 2


def test_async_session_commit_rollback_and_scoped(database_url: str, store: Store) -> None:
    async def body(eng: AsyncEngine) -> tuple[uuid.UUID, uuid.UUID, uuid.UUID]:
        async with AsyncSession(eng) as session:
            async with session.begin():
                kept = await taskline.aenqueue(session, "echo", {"order": 1})
            dropped = await taskline.aenqueue(session, "echo")
            await session.rollback()
        scoped = async_scoped_session(async_sessionmaker(eng), scopefunc=asyncio.current_task)
        from_scoped = await taskline.aenqueue(scoped, "echo")
        await scoped.commit()
        await scoped.remove()
        return kept, dropped, from_scoped
    kept, dropped, from_scoped = run_async(database_url, body)
    assert store.get_job(kept).payload == {"order": 1}
    assert store.get_job(dropped) is None
    assert store.get_job(from_scoped) is not None
    assert sorted(outbox(store)) == sorted([kept, from_scoped])


def test_async_validation_and_idempotency_are_the_sync_ones(database_url: str,
                                                            store: Store) -> None:
    async def body(eng: AsyncEngine) -> None:
        async with AsyncSession(eng) as session, session.begin():
            with pytest.raises(InvalidJob) as info:
                await taskline.aenqueue(session, "echo", priority=12, max_retries=-1)
            assert {e["field"] for e in info.value.errors} == {"priority", "max_retries"}
            with pytest.raises(TypeError, match="colour"):
                await taskline.aenqueue(session, "echo", colour="red")  # type: ignore[call-arg]
            with pytest.raises(InvalidJob):
                await taskline.aenqueue(session, "echo", {"x": float("nan")})
            first = await taskline.aenqueue(session, "echo", {"a": 1}, idempotency_key="o-1")
            assert await taskline.aenqueue(session, "echo", {"a": 1},
                                           idempotency_key="o-1") == first
            with pytest.raises(IdempotencyConflict):
                await taskline.aenqueue(session, "echo", {"a": 2}, idempotency_key="o-1")
            job = await taskline.aenqueue(session, "echo",
                                          settings=Settings(default_max_retries=7))
            assert (await session.execute(text(
                "SELECT max_retries FROM taskline.jobs WHERE id = :id"),
                {"id": job})).scalar_one() == 7
    run_async(database_url, body)
    assert len(outbox(store)) == 2


def test_async_refused_batch_undoes_only_itself(database_url: str, store: Store) -> None:
    async def body(eng: AsyncEngine) -> uuid.UUID:
        async with AsyncSession(eng) as session, session.begin():
            await taskline.aenqueue(session, "echo", {"a": 1}, idempotency_key="k1")
            kept = await taskline.aenqueue(session, "echo", {"kept": True})
            with pytest.raises(IdempotencyConflict):
                await taskline.aenqueue_many(session, [
                    {"type": "echo", "idempotency_key": "k0"},
                    {"type": "echo", "payload": {"a": 2}, "idempotency_key": "k1"}])
            return kept
    kept = run_async(database_url, body)
    assert store.get_job(kept) is not None
    assert store.get_job_and_hash_by_key("default", "k0") is None
    assert len(outbox(store)) == 2  # k1's job and `kept`


# --- the wrong object --------------------------------------------------------------------------

def test_a_wrong_object_is_a_type_error_naming_what_is_accepted(engine: Engine,
                                                                database_url: str) -> None:
    with pytest.raises(TypeError, match=r"scoped_session.*not str"):
        taskline.enqueue("postgresql://", "echo")
    with pytest.raises(TypeError, match="psycopg 3 Connection"):
        taskline.enqueue_many(object(), [])

    async def body(eng: AsyncEngine) -> None:
        async with eng.connect() as conn:
            with pytest.raises(TypeError, match=r"AsyncConnection.*use the `a\.\.\.` function"):
                taskline.enqueue(conn, "echo")
        with engine.connect() as sync_conn:
            for call in (taskline.aenqueue(sync_conn, "echo"),
                         taskline.aenqueue_many(sync_conn, [{"type": "echo"}]),
                         taskline.asubmit_workflow(sync_conn, "wf", STEPS)):
                with pytest.raises(TypeError, match=r"AsyncSession.*use enqueue"):
                    await call
    run_async(database_url, body)
