"""taskline.testing against real PostgreSQL: run_handler, enqueued / assert_enqueued, and drain
running retries, the DLQ, workflows, flow limits, completion hooks and the fence through the
worker's own functions (shown by one spy seeing both a real worker and drain call them)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine, text

import taskline
from taskline import flow
from taskline.execution import outcomes, runner
from taskline.handlers import registry
from taskline.handlers.registry import handler
from taskline.store.store import Store, sqlalchemy_url
from taskline.testing import (
    BadResult,
    NoHandler,
    assert_enqueued,
    drain,
    enqueued,
    run_handler,
)
from taskline.testing.drain import LOCKED_WAIT_S
from tests.helpers import wait_for
from tests.integration.worker_handlers import running_worker

CALLS: list[dict[str, Any]] = []


@handler("tt.greet")
def greet(payload: Any, ctx: Any) -> dict:
    CALLS.append({"type": ctx.type, "attempt": ctx.attempt, "payload": payload})
    if payload.get("fail_until", 0) >= ctx.attempt:
        raise RuntimeError(f"attempt {ctx.attempt} failed")
    if payload.get("hook"):
        ctx.on_complete(lambda conn: conn.execute(
            text("INSERT INTO greeted (name) VALUES (:n)"), {"n": payload["name"]}))
    return {"hello": payload.get("name"), "parents": ctx.parent_results}


@handler("tt.unstorable")
def unstorable(payload: Any, ctx: Any) -> Any:
    return {"not json": object()}


@handler("tt.zombie")
def zombie(payload: Any, ctx: Any) -> str:
    """On its first attempt, loses its lease as the reaper takes it, then returns anyway."""
    if ctx.attempt == 1:
        store = Store.connect(payload["url"], pool_size=1)
        try:
            with store.engine.begin() as conn:
                conn.execute(text("UPDATE taskline.job_leases SET leased_until = now() - "
                                  "interval '1 second' WHERE job_id = :id AND released_at IS "
                                  "NULL"), {"id": ctx.job_id})
            store.recover_expired(10)
        finally:
            store.dispose()
    return f"attempt {ctx.attempt}"


@pytest.fixture(autouse=True)
def _calls() -> Iterator[None]:
    CALLS.clear()
    yield
    CALLS.clear()


@pytest.fixture
def engine(database_url: str) -> Iterator[Any]:
    eng = create_engine(sqlalchemy_url(database_url))
    with eng.begin() as conn:
        conn.execute(text("CREATE TABLE greeted (name text)"))
    yield eng
    eng.dispose()


# --- run_handler ---------------------------------------------------------------------------

def test_run_handler_returns_the_result_with_the_parents_it_is_given():
    result = run_handler("tt.greet", {"name": "ada"}, parent_results={"a": 1}, attempt=2)
    assert result == {"hello": "ada", "parents": {"a": 1}}
    assert CALLS == [{"type": "tt.greet", "attempt": 2, "payload": {"name": "ada"}}]


def test_run_handler_raises_what_the_handler_raises_and_refuses_unknown_or_unstorable():
    with pytest.raises(RuntimeError, match="attempt 1 failed"):
        run_handler("tt.greet", {"fail_until": 1})
    with pytest.raises(NoHandler, match=r"tt\.nothing"):
        run_handler("tt.nothing")
    with pytest.raises(BadResult):
        run_handler("tt.unstorable")


def test_run_handler_runs_completion_hooks_in_the_connections_transaction_only_when_given(
        engine):
    run_handler("tt.greet", {"name": "no conn", "hook": True})
    with engine.connect() as conn:
        run_handler("tt.greet", {"name": "rolled back", "hook": True}, conn=conn)
        assert conn.execute(text("SELECT name FROM greeted")).scalars().all() == ["rolled back"]
        conn.rollback()
    with engine.begin() as conn:
        run_handler("tt.greet", {"name": "kept", "hook": True}, conn=conn)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT name FROM greeted")).scalars().all() == ["kept"]


# --- enqueued / assert_enqueued ------------------------------------------------------------

def test_enqueued_sees_the_open_transactions_jobs_and_matches_on_fields(database_url):
    with psycopg.connect(database_url) as conn:
        taskline.enqueue(conn, "tt.greet", {"name": "ada", "lang": "en"}, priority="high",
                         queue="mail", idempotency_key="k-1")
        taskline.enqueue(conn, "tt.other", [1, 2])
        job = assert_enqueued(conn, "tt.greet", payload={"name": "ada"}, queue="mail",
                              priority=7, idempotency_key="k-1")
        assert job["payload"] == {"name": "ada", "lang": "en"} and job["status"] == "queued"
        assert [j["type"] for j in enqueued(conn)] == ["tt.greet", "tt.other"]
        assert enqueued(conn, "tt.other", payload=[1, 2])
        assert not enqueued(conn, "tt.greet", payload={"name": "bob"})
        assert not enqueued(conn, "tt.greet", priority="low")
        conn.rollback()
        assert enqueued(conn) == []


def test_enqueued_counts_from_the_tests_start_or_since(database_url, store):
    with psycopg.connect(database_url) as conn:
        delayed = taskline.enqueue(conn, "tt.greet", {"name": "later"}, delay_s=3600)
        conn.commit()
        assert len(enqueued(conn, "tt.greet")) == 1  # made since this test began
        assert enqueued(conn, "tt.greet", since=time.time() + 60) == []
        run_at = store.get_job(delayed).next_run_at
        assert enqueued(conn, "tt.greet", run_at=run_at)[0]["id"] == str(delayed)
        assert enqueued(conn, "tt.greet", run_at=run_at - timedelta(minutes=5)) == []


def test_assert_enqueued_lists_what_was_enqueued_instead(database_url):
    with psycopg.connect(database_url) as conn:
        with pytest.raises(AssertionError, match="no job was enqueued"):
            assert_enqueued(conn, "tt.greet")
        taskline.enqueue(conn, "tt.greet", {"name": "ada"})
        taskline.enqueue(conn, "tt.greet", {"name": "bob"})
        with pytest.raises(AssertionError) as failed:
            assert_enqueued(conn, "tt.greet", payload={"name": "cy"})
        assert "enqueued instead" in str(failed.value)
        assert "'name': 'ada'" in str(failed.value) and "'name': 'bob'" in str(failed.value)
        with pytest.raises(AssertionError, match=r"2 jobs of type 'tt\.greet' match"):
            assert_enqueued(conn, "tt.greet")
        with pytest.raises(TypeError, match="cannot match on colour"):
            enqueued(conn, colour="red")


# --- drain ---------------------------------------------------------------------------------

def commit_jobs(database_url: str, *jobs: tuple[str, Any, dict]) -> list[Any]:
    with psycopg.connect(database_url) as conn:
        return [taskline.enqueue(conn, t, p, **f) for t, p, f in jobs]


def test_drain_retries_then_succeeds_and_dead_letters_what_keeps_failing(database_url, store):
    ok, flaky, doomed = commit_jobs(
        database_url, ("tt.greet", {"name": "ok"}, {}),
        ("tt.greet", {"name": "flaky", "fail_until": 1}, {"max_retries": 2}),
        ("tt.greet", {"name": "doomed", "fail_until": 9}, {"max_retries": 1}))
    drained = drain(database_url)
    assert (drained.succeeded, drained.retried, drained.dead) == (2, 2, 1)
    assert len(drained.jobs) == 5
    assert store.get_job(ok).result == {"hello": "ok", "parents": {}}
    assert store.get_job(flaky).status.value == "succeeded"
    assert store.get_job(flaky).attempts == 2
    dead = store.get_job(doomed)
    assert dead.status.value == "dead" and "attempt 2 failed" in dead.last_error
    assert [d["job"].id for d in store.list_dead(queue=None, after=None, limit=10)] == [doomed]


def test_drain_leaves_backoff_alone_when_asked_and_stops_at_max_jobs(database_url, store):
    flaky, other = commit_jobs(
        database_url, ("tt.greet", {"name": "flaky", "fail_until": 1}, {}),
        ("tt.greet", {"name": "other"}, {"queue": "second"}))
    drained = drain(database_url, queues=["default"], skip_backoff=False)
    assert [j["outcome"] for j in drained.jobs] == ["retried"]
    assert store.get_job(flaky).status.value == "retrying"
    assert store.get_job(other).status.value == "queued"
    assert len(drain(database_url, max_jobs=1).jobs) == 1
    assert drain(database_url).succeeded == 1


def test_drain_waits_for_a_due_jobs_row_another_transaction_holds(database_url, store):
    """A waiter flagging the job it waits for holds the job's row for a moment, and the claim
    skips a held row: drain waits for it rather than end with the job queued; a row held past
    LOCKED_WAIT_S is left, and a queue with nothing held ends the drain at once."""
    (job,) = commit_jobs(database_url, ("tt.greet", {"name": "held"}, {}))
    with psycopg.connect(database_url) as holder:
        holder.execute("SELECT 1 FROM taskline.jobs WHERE id = %s FOR UPDATE", (job,))
        threading.Timer(0.3, holder.commit).start()
        started = time.monotonic()
        drained = drain(database_url)
    assert drained.succeeded == 1 and store.get_job(job).status.value == "succeeded"
    assert time.monotonic() - started >= 0.3  # it waited for the holder's commit
    (kept,) = commit_jobs(database_url, ("tt.greet", {"name": "kept"}, {}))
    with psycopg.connect(database_url) as holder:
        holder.execute("SELECT 1 FROM taskline.jobs WHERE id = %s FOR UPDATE", (kept,))
        started = time.monotonic()
        assert drain(database_url).jobs == []
        waited = time.monotonic() - started
    assert LOCKED_WAIT_S <= waited < LOCKED_WAIT_S + 2
    assert store.get_job(kept).status.value == "queued"
    store.pause_queue("default", "test")  # a due job no claim may take: nothing to wait for
    started = time.monotonic()
    assert drain(database_url).jobs == [] and time.monotonic() - started < 1.0


def test_drain_runs_a_workflow_in_order_with_parent_results(database_url, store):
    with psycopg.connect(database_url) as conn:
        wf = taskline.submit_workflow(conn, "greetings", [
            {"id": "a", "job": {"type": "tt.greet", "payload": {"name": "a"}}},
            {"id": "b", "job": {"type": "tt.greet", "payload": {"name": "b"}}, "after": ["a"]},
        ])
    drained = drain(database_url)
    assert [c["payload"]["name"] for c in CALLS] == ["a", "b"]
    assert drained.succeeded == 2
    steps = {s["step"]: s for s in store.workflow_steps([wf])[wf]}
    assert steps["b"]["status"] == "succeeded"
    assert store.get_job(steps["b"]["id"]).result["parents"] == {
        "a": {"hello": "a", "parents": {}}}


def test_drain_commits_completion_hooks_with_the_success(engine, database_url):
    commit_jobs(database_url, ("tt.greet", {"name": "hooked", "hook": True}, {}))
    assert drain(engine).succeeded == 1
    with engine.connect() as conn:
        assert conn.execute(text("SELECT name FROM greeted")).scalars().all() == ["hooked"]


def test_drain_runs_limited_jobs_through_the_budgeted_claim(database_url, store):
    store.put_flow_limit(flow.Limit(scope="type:tt.greet", concurrency=1))
    commit_jobs(database_url, *[("tt.greet", {"name": str(n)}, {}) for n in range(3)])
    assert drain(database_url).succeeded == 3


def test_drain_runs_a_keys_jobs_in_enqueue_order_through_the_library(database_url):
    commit_jobs(database_url, *[("tt.greet", {"name": str(n)},
                                 {"ordering_key": "acct", "priority": n}) for n in range(4)])
    assert drain(database_url).succeeded == 4
    assert [c["payload"]["name"] for c in CALLS] == ["0", "1", "2", "3"]  # not by priority


def test_drain_fences_an_outcome_whose_lease_was_taken(database_url, store):
    (job,) = commit_jobs(database_url, ("tt.zombie", {"url": database_url}, {}))
    drained = drain(database_url)
    assert [j["attempt"] for j in drained.jobs] == [1, 2]
    assert drained.jobs[0]["outcome"] == "retried"  # the reaper's move stands
    final = store.get_job(job)
    assert final.status.value == "succeeded" and final.result == "attempt 2"
    outcomes_seen = [lease["outcome"] for lease in store.get_history(job)[1]]
    assert "succeeded" in outcomes_seen and outcomes_seen.count("succeeded") == 1


def test_drain_accepts_the_connections_an_application_holds(database_url, engine):
    commit_jobs(database_url, ("tt.greet", {"name": "x"}, {}), ("tt.greet", {"name": "y"}, {}))
    with engine.connect() as conn:
        assert drain(conn, max_jobs=1).succeeded == 1
    with psycopg.connect(database_url) as conn:
        assert drain(conn).succeeded == 1
    with pytest.raises(TypeError, match="expected a database URL"):
        drain(42)


def test_the_worker_and_drain_call_the_same_handler_call_and_outcome_report(
        database_url, settings, store, dispatcher, monkeypatch):
    """One spy on each shared function sees a real worker's attempt and drain's."""
    calls: list[str] = []
    ends: list[str] = []
    call, ended = runner.call_handler, outcomes.Recorder.ended

    def spy_call(attempt: Any) -> Any:
        calls.append(threading.current_thread().name)
        return call(attempt)

    def spy_ended(self: Any, attempt: Any, result: Any, error: Any) -> None:
        ends.append(attempt.job.type)
        ended(self, attempt, result, error)

    monkeypatch.setattr(runner, "call_handler", spy_call)
    monkeypatch.setattr(outcomes.Recorder, "ended", spy_ended)
    from tests.helpers import enqueue

    by_worker = enqueue(store, dispatcher, "echo", {"n": 1})
    with running_worker(settings):
        wait_for(lambda: store.get_job(by_worker.id).status.value == "succeeded", timeout=10,
                 message="the worker ran its job")
    commit_jobs(database_url, ("tt.greet", {"name": "drained"}, {}))
    assert drain(database_url).succeeded == 1
    assert len(calls) == 2 and calls[0].startswith("taskline-handler-")
    assert calls[1] == threading.current_thread().name
    assert ends == ["echo", "tt.greet"]
    assert registry.get("tt.greet") is greet
