"""TASKLINE_MAX_QUEUES against real PostgreSQL: a job for one queue more than the limit allows
(queues holding unfinished jobs) is refused whole and writes nothing, through the API's single
and batch enqueues (the one-statement insert and the COPY of a large batch), workflows, the
library's enqueue in the caller's transaction and the scheduler;
a job for a queue that already holds unfinished jobs (queued, running, scheduled) is accepted
at the limit, and a queue whose jobs finished no longer counts. A requeue of dead jobs is not
refused (docs/api.md): it returns jobs the limit once admitted."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import psycopg
import pytest
from flask.testing import FlaskClient
from sqlalchemy import create_engine, event, text
from sqlalchemy.ext.asyncio import create_async_engine

import taskline
from taskline.errors import InvalidJob, QueueLimitReached
from taskline.jobs import new_job_id
from taskline.settings import Settings
from taskline.store.bulk import COPY_MIN_JOBS
from taskline.store.queries import load_queries
from taskline.store.store import Store, sqlalchemy_url
from taskline_maintenance.scheduler import Scheduler
from taskline_producer.app import close_app, create_app
from tests.helpers import make_dead

LIMIT = 3


@pytest.fixture
def limited(settings: Settings) -> Iterator[FlaskClient]:
    app = create_app(settings.replace(max_queues=LIMIT))
    yield app.test_client()
    close_app(app)


def enqueue(client: FlaskClient, queue: str, **fields: object):
    return client.post("/api/v1/jobs", json={"type": "echo", "queue": queue, **fields})


def jobs(store: Store) -> int:
    with store.transaction() as conn:
        return conn.execute(text("SELECT count(*) FROM taskline.jobs")).scalar_one()


def test_a_job_for_one_queue_too_many_is_a_422_and_writes_nothing(limited, store):
    for queue in ("q1", "q2"):
        assert enqueue(limited, queue).status_code == 201
    assert enqueue(limited, "q3", delay_s=3600).status_code == 201  # scheduled counts too
    before = jobs(store)
    refused = enqueue(limited, "q4")
    assert refused.status_code == 422
    error = refused.get_json()["error"]
    assert error["code"] == "queue_limit"
    assert error["details"] == {"limit": LIMIT, "queues": ["q4"]}
    batch = limited.post("/api/v1/jobs/batch", json={"jobs": [
        {"type": "echo", "queue": "q1"}, {"type": "echo", "queue": "q5"}]})
    assert batch.status_code == 422 and batch.get_json()["error"]["code"] == "queue_limit"
    assert jobs(store) == before
    # Queues that hold unfinished jobs take more at the limit.
    for queue in ("q1", "q2", "q3"):
        assert enqueue(limited, queue).status_code == 201


def test_a_queue_whose_jobs_finished_no_longer_counts(limited, store):
    for queue in ("q1", "q2", "q3"):
        assert enqueue(limited, queue).status_code == 201
    assert enqueue(limited, "q4").status_code == 422
    with store.transaction() as conn:
        conn.execute(text("UPDATE taskline.jobs SET status = 'running' WHERE queue = 'q2'"))
        conn.execute(text("UPDATE taskline.jobs SET status = 'succeeded', "
                          "finished_at = now() WHERE queue = 'q1'"))
    assert enqueue(limited, "q2").status_code == 201  # running: still a queue of its own
    assert enqueue(limited, "q4").status_code == 201
    assert enqueue(limited, "q1").status_code == 422


def test_a_dead_job_is_requeued_at_the_limit_and_then_counts(limited, store, dispatcher):
    (dead,) = make_dead(store, dispatcher, 1, queue="q9")
    for queue in ("q1", "q2", "q3"):
        assert enqueue(limited, queue).status_code == 201
    requeued = limited.post(f"/api/v1/jobs/{dead}/retry")
    assert requeued.status_code == 200 and requeued.get_json()["status"] == "queued"
    # Four queues hold work now: a new queue is refused until one of them drains.
    assert enqueue(limited, "q4").status_code == 422
    assert enqueue(limited, "q9").status_code == 201


def test_a_large_batch_written_by_copy_is_refused_whole(limited, store):
    for queue in ("q1", "q2", "q3"):
        assert enqueue(limited, queue).status_code == 201
    before = jobs(store)
    body = {"jobs": [{"type": "echo", "queue": "q1"}] * (COPY_MIN_JOBS - 1)
            + [{"type": "echo", "queue": "new"}]}
    refused = limited.post("/api/v1/jobs/batch", json=body)
    assert refused.status_code == 422
    assert refused.get_json()["error"]["details"]["queues"] == ["new"]
    assert jobs(store) == before
    body = {"jobs": [{"type": "echo", "queue": "q2"}] * COPY_MIN_JOBS}
    assert limited.post("/api/v1/jobs/batch", json=body).status_code == 201


def test_a_schedule_s_slot_over_the_limit_writes_nothing(store, dispatcher, settings):
    store.max_queues = 1
    store.insert_jobs_with_events([{
        "id": new_job_id(), "type": "echo", "queue": "full", "payload": {}, "priority": 5,
        "status": "queued", "max_retries": 0, "timeout_s": 30.0, "run_at": None,
        "delay_s": 0.0, "idempotency_key": None, "request_hash": None, "trace_context": None,
        "actor": None, "limit_key": None}])
    store.upsert_schedule(name="s", cron="* * * * * *", timezone="UTC", paused=False,
                          catch_up="latest", job={"type": "echo", "payload": {},
                                                  "queue": "other", "priority": 5,
                                                  "max_retries": 0, "timeout_s": 30.0})
    row = store.get_schedule("s")
    with pytest.raises(QueueLimitReached):
        store.fire_slot(row, row.db_now.replace(microsecond=0))
    assert Scheduler(store, dispatcher, settings).run_once().fired == 0
    with store.transaction() as conn:
        assert conn.execute(text("SELECT count(*) FROM taskline.schedule_slots")).scalar() == 0
    assert jobs(store) == 1


def test_the_library_enqueue_refuses_a_queue_too_many_and_writes_nothing(database_url,
                                                                         settings, store):
    limited = settings.replace(max_queues=2)
    engine = create_engine(sqlalchemy_url(database_url))
    try:
        with engine.begin() as conn:
            taskline.enqueue(conn, "echo", queue="a", settings=limited)
            taskline.enqueue(conn, "echo", queue="b", settings=limited)
        with engine.begin() as conn:
            with pytest.raises(QueueLimitReached) as refused:
                taskline.enqueue_many(conn, [{"type": "echo", "queue": "a"},
                                             {"type": "echo", "queue": "c"}], settings=limited)
            assert isinstance(refused.value, InvalidJob) and refused.value.queues == ["c"]
            taskline.enqueue(conn, "echo", queue="a", settings=limited)  # goes on
        with psycopg.connect(database_url) as conn, pytest.raises(QueueLimitReached):
            taskline.enqueue(conn, "echo", queue="c", settings=limited)
    finally:
        engine.dispose()
    assert jobs(store) == 3


def owed(store: Store) -> int:
    with store.transaction() as conn:
        return conn.execute(text("SELECT count(*) FROM taskline.enqueue_outbox")).scalar_one()


def test_the_library_counts_a_queue_without_work_then_writes_its_job(database_url, settings,
                                                                     store):
    """A queue holding no queued or running job is counted before the write: written whole
    under the limit, with its event and outbox row, and an idempotency key's replay found after
    the count."""
    limited = settings.replace(max_queues=2)
    with psycopg.connect(database_url) as conn:
        first = taskline.enqueue(conn, "echo", queue="s", delay_s=3600, idempotency_key="k",
                                 settings=limited)  # scheduled: "s" holds no queued job
        conn.commit()
        assert taskline.enqueue(conn, "echo", queue="s", delay_s=3600, idempotency_key="k",
                                settings=limited) == first  # counted, then replayed
        ids = taskline.enqueue_many(conn, [{"type": "echo", "queue": "a"},
                                           {"type": "echo", "queue": "s"}], settings=limited)
        conn.commit()
        assert len(set(ids)) == 2 and first not in ids
        with pytest.raises(QueueLimitReached) as refused:
            taskline.enqueue(conn, "echo", queue="c", settings=limited)
        assert refused.value.queues == ["c"]
    assert jobs(store) == 3 and owed(store) == 3
    with store.transaction() as conn:
        events = conn.execute(text("SELECT count(*) FROM taskline.job_events")).scalar_one()
    assert events == 3


def test_the_library_writes_to_an_idle_queue_in_one_statement(database_url, settings, store):
    """A queue holding no queued or running job is judged inside the insert (queues_admitted,
    migration 0025): one statement writes its job; only a queue the limit refuses goes on to
    the count, which names it, and nothing is written."""
    limited = settings.replace(max_queues=2)
    engine = create_engine(sqlalchemy_url(database_url))
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute",
                 lambda _c, _cur, sql, *_rest: statements.append(sql))
    try:
        with engine.begin() as conn:
            taskline.enqueue(conn, "echo", queue="a", settings=limited)  # an empty database
            assert len(statements) == 1
            taskline.enqueue(conn, "echo", queue="b", delay_s=3600, settings=limited)
            taskline.enqueue(conn, "echo", queue="b", settings=limited)  # b holds parked work
            assert len(statements) == 3
        statements.clear()
        with engine.begin() as conn, pytest.raises(QueueLimitReached) as refused:
            taskline.enqueue(conn, "echo", queue="c", settings=limited)
        assert refused.value.queues == ["c"] and len(statements) == 2  # the insert, the count
        statements.clear()
        with engine.begin() as conn:
            taskline.enqueue(conn, "echo", queue="a", settings=limited)  # a holds work now
            conn.execute(text("UPDATE taskline.jobs SET status = 'succeeded' "
                              "WHERE queue = 'a'"))
            statements.clear()
            # A batch to idle queues "a" and "b" (b holds a scheduled job): one statement.
            taskline.enqueue_many(conn, [{"type": "echo", "queue": "a"},
                                         {"type": "echo", "queue": "b"}], settings=limited)
            assert len(statements) == 1
    finally:
        engine.dispose()
    assert jobs(store) == 6 and owed(store) == 6


def test_the_async_library_writes_to_an_idle_queue_in_one_statement(database_url, settings,
                                                                    store):
    """aenqueue's plain job takes the sync enqueue's statement: to an idle queue, one."""
    engine = create_async_engine(sqlalchemy_url(database_url).replace("+psycopg://",
                                                                      "+psycopg_async://"))
    statements: list[str] = []
    event.listen(engine.sync_engine, "before_cursor_execute",
                 lambda _c, _cur, sql, *_rest: statements.append(sql))

    async def body() -> None:
        async with engine.begin() as conn:
            await taskline.aenqueue(conn, "echo", queue="idle", settings=settings)
        await engine.dispose()

    asyncio.run(body())
    assert len(statements) == 1 and "limit_queues" not in statements[0]  # not the batch one
    assert jobs(store) == 1 and owed(store) == 1


def test_the_async_library_enqueue_counts_and_refuses_as_the_sync_one(database_url, settings,
                                                                      store):
    limited = settings.replace(max_queues=1)

    async def body() -> None:
        async with await psycopg.AsyncConnection.connect(database_url) as conn:
            await taskline.aenqueue(conn, "echo", queue="a", settings=limited)
            await conn.commit()
            with pytest.raises(QueueLimitReached) as refused:
                await taskline.aenqueue(conn, "echo", queue="b", settings=limited)
            assert refused.value.queues == ["b"]
            await conn.rollback()
            await taskline.aenqueue(conn, "echo", queue="a", settings=limited)
            await conn.commit()

    asyncio.run(body())
    assert jobs(store) == 2 and owed(store) == 2


def test_a_workflow_with_a_step_for_a_queue_too_many_is_refused_whole(limited, store):
    for queue in ("q1", "q2", "q3"):
        assert enqueue(limited, queue).status_code == 201
    steps = [{"id": "a", "job": {"type": "echo", "queue": "q1"}},
             {"id": "b", "job": {"type": "echo", "queue": "new"}, "after": ["a"]}]
    refused = limited.post("/api/v1/workflows", json={"name": "wf", "steps": steps})
    assert refused.status_code == 422
    assert refused.get_json()["error"]["code"] == "queue_limit"
    assert jobs(store) == 3
    assert limited.get("/api/v1/workflows").get_json()["workflows"] == []


def set_status(store: Store, queue: str, status: str) -> None:
    with store.transaction() as conn:
        conn.execute(text("UPDATE taskline.jobs SET status = :status WHERE queue = :queue"),
                     {"status": status, "queue": queue})


def test_every_unfinished_state_holds_its_queue_and_a_queue_counts_once(limited, store):
    """The count reads queued, scheduled/retrying/waiting and running jobs by three indexes:
    each state alone holds its queue, and a queue in several of them counts once."""
    for queue in ("q1", "q2", "q3"):
        assert enqueue(limited, queue).status_code == 201
    assert enqueue(limited, "q1", delay_s=3600).status_code == 201  # q1 queued and scheduled
    assert enqueue(limited, "q4").status_code == 422
    for status in ("retrying", "waiting", "running", "scheduled"):
        set_status(store, "q2", status)
        refused = enqueue(limited, "q4")
        assert refused.status_code == 422, status
        assert refused.get_json()["error"]["details"]["queues"] == ["q4"]
    set_status(store, "q2", "dead")
    assert enqueue(limited, "q4").status_code == 201
    # q4 now queued: a job for q4 that is also scheduled there is no queue more.
    assert enqueue(limited, "q4", delay_s=3600).status_code == 201


def index_scans(conn) -> dict[str, int]:
    """This transaction's scans of each index of jobs so far."""
    rows = conn.execute(text("SELECT c.relname, pg_stat_get_xact_numscans(c.oid) FROM pg_index i "
                             "JOIN pg_class c ON c.oid = i.indexrelid "
                             "WHERE i.indrelid = 'taskline.jobs'::regclass")).all()
    return dict(rows)


def test_the_count_reads_queues_not_jobs(store):
    """A write to a queue without work counts the queues holding unfinished jobs one probe per
    queue (queues_in_use: jobs_claimable, jobs_parked_queue): counted by job, it read every one
    of the 16,000 queued and 4,000 scheduled jobs here (57 ms an enqueue beside 200,000 queued
    jobs)."""
    rows = [{"id": str(new_job_id()), "type": "echo", "queue": f"q{i % 5}", "payload": {},
             "priority": 5, "status": "queued" if i < 16000 else "scheduled",
             "max_retries": 3, "timeout_s": 30.0, "run_at": None, "delay_s": 0,
             "idempotency_key": None, "request_hash": None, "trace_context": None,
             "actor": None, "limit_key": None} for i in range(20000)]
    store.insert_jobs_with_events(rows)
    counting = str(load_queries()["queue_limit_refused"])
    with store.engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(
            text("VACUUM ANALYZE taskline.jobs"))
    with store.engine.connect() as conn:
        conn.execute(text("SELECT * FROM taskline.queues_in_use('{}')"))  # plans its body
        before = index_scans(conn)
        shown = conn.execute(text("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + counting),
                             {"queues": ["empty"], "max_queues": 3}).scalar_one()
        after = index_scans(conn)
        conn.rollback()
    plan = json.dumps(shown)
    top = shown[0]["Plan"]
    assert "queues_in_use" in plan and "Seq Scan" not in plan, plan
    assert after["jobs_parked_queue"] > before["jobs_parked_queue"], (before, after)
    assert after["jobs_claimable"] > before["jobs_claimable"], (before, after)
    assert top["Shared Hit Blocks"] + top["Shared Read Blocks"] < 100, plan
    one = {**rows[0], "id": str(new_job_id()), "queue": "empty", "status": "queued"}
    store.max_queues = 5  # q0 - q4 hold unfinished jobs
    with pytest.raises(QueueLimitReached) as refused:
        store.insert_jobs_with_events([one])
    assert refused.value.queues == ["empty"]
    store.max_queues = 6
    assert len(store.insert_jobs_with_events([one])) == 1
