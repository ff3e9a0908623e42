"""`taskline.enqueue` / `enqueue_many` on the caller's own connection (real PostgreSQL).

The job exists exactly when the caller commits: with SQLAlchemy (Connection and ORM Session)
and with psycopg 3; the NOTIFY arrives only at the commit; validation is the API's, raising
typed errors; idempotency keys behave as in the API, and a refused batch leaves the rest of
the caller's transaction alone.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.orm import Session

import taskline
from taskline.enqueuing import CHANNEL, JOBS_CHANNEL
from taskline.errors import IdempotencyConflict, InvalidJob
from taskline.jobs import Status
from taskline.jobspec import parse_job
from taskline.settings import Settings
from taskline.store.rows import Owed
from taskline.store.store import Store, sqlalchemy_url


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    eng = create_engine(sqlalchemy_url(database_url))
    yield eng
    eng.dispose()


def _outbox(store: Store) -> list[uuid.UUID]:
    with store.transaction() as conn:
        return [r.job_id for r in conn.execute(text("SELECT job_id FROM taskline.enqueue_outbox"))]


def _events(store: Store, job_id: uuid.UUID) -> list[str]:
    return [e["event"] for e in store.get_history(job_id)[0]]


def test_sqlalchemy_job_exists_only_after_commit(engine: Engine, store: Store) -> None:
    with engine.connect() as conn:
        conn.execute(text("CREATE TABLE orders (id int)"))
        conn.commit()
        conn.execute(text("INSERT INTO orders VALUES (1)"))
        job_id = taskline.enqueue(conn, "echo", {"order": 1}, priority="high", queue="mail")
        assert store.get_job(job_id) is None  # not visible outside the open transaction
        conn.commit()
    job = store.get_job(job_id)
    assert (job.type, job.queue, job.priority, job.status, job.payload) == (
        "echo", "mail", 7, "queued", {"order": 1})
    assert (job.max_retries, job.timeout_s) == (3, 300.0)
    assert _events(store, job_id) == ["enqueued"]
    assert _outbox(store) == [job_id]


def test_rolled_back_job_leaves_nothing(engine: Engine, store: Store) -> None:
    with engine.connect() as conn:
        job_id = taskline.enqueue(conn, "echo")
        conn.rollback()
    assert store.get_job(job_id) is None
    assert _outbox(store) == []


def test_psycopg_connection_and_notify_at_commit(database_url: str, store: Store) -> None:
    with psycopg.connect(database_url, autocommit=True) as listener, \
            psycopg.connect(database_url) as conn:
        listener.execute(f"LISTEN {CHANNEL}")
        ids = taskline.enqueue_many(conn, [{"type": "echo", "queue": "a"},
                                           {"type": "echo", "queue": "b", "delay_s": 30},
                                           {"type": "echo", "queue": "a"}])
        assert list(listener.notifies(timeout=0.3)) == []  # nothing before the commit
        conn.commit()
        heard = list(listener.notifies(timeout=2, stop_after=2))
    assert sorted(n.payload for n in heard) == ["a", "b"]  # one signal per queue
    assert [store.get_job(i).status for i in ids] == ["queued", "scheduled", "queued"]
    assert _events(store, ids[1]) == ["scheduled"]
    assert sorted(_outbox(store)) == sorted(ids)


def test_each_job_is_announced_at_commit(database_url: str, store: Store) -> None:
    with psycopg.connect(database_url, autocommit=True) as listener, \
            psycopg.connect(database_url) as conn:
        listener.execute(f"LISTEN {JOBS_CHANNEL}")
        ids = taskline.enqueue_many(conn, [{"type": "echo", "queue": "q:1", "priority": 8},
                                           {"type": "echo", "delay_s": 60}])
        conn.commit()
        heard = {owed.job_id: owed for owed in (
            Owed.from_announcement(n.payload) for n in listener.notifies(timeout=2, stop_after=2))}
    first, second = (store.get_job(i) for i in ids)
    assert heard[str(ids[0])] == Owed(str(ids[0]), "q:1", 8, Status.QUEUED,
                                      round(first.next_run_at.timestamp() * 1000))
    assert heard[str(ids[1])] == Owed(str(ids[1]), "default", 5, Status.SCHEDULED,
                                      round(second.next_run_at.timestamp() * 1000))
    assert heard[str(ids[1])].committed().due_ms == heard[str(ids[1])].due_ms
    assert Owed.from_announcement("not one") is None
    assert Owed.from_announcement(f"{ids[0]} 5 bogus 0 default") is None
    assert Owed.from_announcement("not-an-id 5 queued 0 default") is None


def test_autocommit_psycopg_commits_at_once(database_url: str, store: Store) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        job_id = taskline.enqueue(conn, "echo", [1, 2])
    assert store.get_job(job_id).payload == [1, 2]


def test_orm_session(engine: Engine, store: Store) -> None:
    with Session(engine) as session:
        job_id = taskline.enqueue(session, "echo", run_at=datetime.now(UTC) + timedelta(hours=1))
        session.commit()
    assert store.get_job(job_id).status == "scheduled"


def test_validation_is_the_apis(engine: Engine, store: Store) -> None:
    bad = {"type": "echo", "priority": 12, "max_retries": -1}
    api_errors = parse_job(bad, Settings())
    with engine.connect() as conn, pytest.raises(InvalidJob) as info:
        taskline.enqueue(conn, "echo", priority=12, max_retries=-1)
    assert info.value.errors == [e.to_dict() for e in api_errors]
    assert {e["field"] for e in info.value.errors} == {"priority", "max_retries"}
    # The fields are keyword arguments: an unknown one fails the call (and a type checker).
    with engine.connect() as conn, pytest.raises(TypeError, match="colour"):
        taskline.enqueue(conn, "echo", colour="red")  # type: ignore[call-arg]
    with engine.connect() as conn:
        for payload in ({"x": float("nan")}, {"x": "a\x00b"}, {1: "int key"}, {"s": {1, 2}}):
            with pytest.raises(InvalidJob) as info:
                taskline.enqueue(conn, "echo", payload)
            assert info.value.errors[0]["field"] == "payload"
        with pytest.raises(InvalidJob) as info:
            taskline.enqueue(conn, "echo", run_at=datetime(2030, 1, 1))  # naive: no instant
        assert info.value.errors[0]["field"] == "run_at"
        with pytest.raises(InvalidJob) as info:
            taskline.enqueue_many(conn, [{"type": "echo"}, {"type": ""}])
        assert info.value.errors[0]["field"] == "jobs[1].type"
        deep: list = []
        for _ in range(70):
            deep = [deep]
        with pytest.raises(InvalidJob):
            taskline.enqueue(conn, "echo", deep)
        conn.commit()
    assert _outbox(store) == []


def test_settings_give_the_defaults(engine: Engine, store: Store) -> None:
    with engine.begin() as conn:
        job_id = taskline.enqueue(conn, "echo", settings=Settings(default_max_retries=7))
    assert store.get_job(job_id).max_retries == 7


def test_idempotency_key_replays_and_conflicts(engine: Engine, store: Store) -> None:
    with engine.begin() as conn:
        first = taskline.enqueue(conn, "echo", {"a": 1}, idempotency_key="order-1")
    with engine.begin() as conn:
        assert taskline.enqueue(conn, "echo", {"a": 1}, idempotency_key="order-1") == first
    with engine.connect() as conn, pytest.raises(IdempotencyConflict):
        taskline.enqueue(conn, "echo", {"a": 2}, idempotency_key="order-1")
    assert _outbox(store) == [first]


def test_a_refused_batch_undoes_only_itself(engine: Engine, store: Store) -> None:
    with engine.begin() as conn:
        taskline.enqueue(conn, "echo", {"a": 1}, idempotency_key="k1")
    with engine.connect() as conn:
        kept = taskline.enqueue(conn, "echo", {"kept": True})
        with pytest.raises(IdempotencyConflict):
            taskline.enqueue_many(conn, [{"type": "echo", "idempotency_key": "k0"},
                                         {"type": "echo", "payload": {"a": 2},
                                          "idempotency_key": "k1"}])
        conn.commit()
    assert store.get_job(kept) is not None
    assert store.get_job_and_hash_by_key("default", "k0") is None
    assert len(_outbox(store)) == 2  # k1's first job and `kept`


def test_a_row_carries_only_the_fields_set(engine: Engine, store: Store) -> None:
    """The insert's JSON leaves out what a job does not set (PostgreSQL reads an absent field as
    NULL), and writes every optional field a job does set."""
    sent: list[dict] = []
    event.listen(engine, "before_cursor_execute",
                 lambda _c, _cur, _sql, params, *_rest: sent.append(params))
    due = datetime.now(UTC) + timedelta(hours=1)
    expires = due + timedelta(hours=1)
    with engine.begin() as conn:
        plain, full = taskline.enqueue_many(conn, [
            {"type": "echo"},
            {"type": "echo", "run_at": due, "idempotency_key": "k", "limit_key": "tenant-1",
             "ordering_key": "account-1", "tags": ["blue"], "expires_at": expires}])
    inserts = [p["jobs"] for p in sent if isinstance(p, dict) and "jobs" in p]
    assert len(inserts) == 1  # the batch is one insert (after its savepoint)
    rows = {row["id"]: row for row in json.loads(inserts[0])}
    assert set(rows[str(plain)]) == {"id", "type", "queue", "payload", "priority",
                                     "max_retries", "timeout_s", "delay_s"}
    assert None not in rows[str(full)].values()
    job = store.get_job(full)
    assert (job.idempotency_key, job.limit_key, job.ordering_key, job.tags) == (
        "k", "tenant-1", "account-1", ("blue",))
    assert (job.status, job.next_run_at, job.expires_at) == (Status.SCHEDULED, due, expires)
    bare = store.get_job(plain)
    assert (bare.idempotency_key, bare.limit_key, bare.ordering_key, bare.tags,
            bare.expires_at) == (None, None, None, None, None)
