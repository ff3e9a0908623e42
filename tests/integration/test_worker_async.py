"""`async def` handlers in a real worker against real PostgreSQL and Redis: they run on the
process's event loop with the lease, renewal, fencing, timeout, cancel, completion-hook, retry
and DLQ semantics of thread handlers, share `--concurrency` with them, and a handler that
blocks the loop delays neither lease renewal nor timeouts."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from prometheus_client import REGISTRY
from sqlalchemy import text

import taskline
from taskline.execution.eventloop import LOOP_THREAD
from taskline.testing import drain, run_handler
from taskline_worker.worker import Exit
from tests.helpers import enqueue, wait_for
from tests.integration import async_handlers as ah
from tests.integration import worker_handlers as th
from tests.integration.test_worker_lifecycle import refusing_connections, released
from tests.integration.test_worker_outcomes import (
    events,
    outcomes,
    promote_due,
    status_of,
    steal_lease,
    wait_status,
)
from tests.integration.worker_handlers import WorkerThread, running_worker


@pytest.fixture(autouse=True)
def clean(clean_handlers):
    ah.reset()
    yield
    ah.reset()


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_coroutine_handler_runs_on_the_event_loop_and_its_result_is_stored(
        settings, store, dispatcher):
    jobs = [enqueue(store, dispatcher, "t.async.record", {"tag": f"a{n}"}) for n in range(5)]
    with running_worker(settings):
        for job in jobs:
            wait_status(store, job, "succeeded")
    assert {ah.THREADS[f"a{n}"] for n in range(5)} == {LOOP_THREAD}
    assert store.get_job(jobs[0].id).result == {"tag": "a0", "attempt": 1}
    assert outcomes(store, jobs[0]) == ["succeeded"]


def test_a_failing_coroutine_is_retried_then_dead_lettered(settings, store, dispatcher):
    job = enqueue(store, dispatcher, "t.async.fail", {"error": "flaky"}, max_retries=1)
    with running_worker(settings):
        wait_status(store, job, "retrying")
        wait_for(lambda: promote_due(store, dispatcher), message="retry due")
        wait_status(store, job, "dead")
    dead = store.get_job(job.id)
    assert dead.attempts == 2 and dead.last_error == "RuntimeError: flaky"
    assert outcomes(store, job) == ["failed", "failed"]
    assert events(store, job)[-1] == "dead_lettered"
    history, _ = store.get_history(job.id)
    assert "async boom" not in history[-1]["detail"]["error"]
    assert "flaky" in history[-1]["detail"]["traceback"]


def test_a_coroutine_past_its_timeout_is_cancelled_and_failed(settings, store, dispatcher):
    job = enqueue(store, dispatcher, "t.async.sleep", {"sleep_s": 20}, timeout_s=0.3,
                  max_retries=0)
    with running_worker(settings, concurrency=1) as worker:
        wait_status(store, job, "dead")
        # The task took its cancellation: nothing is left abandoned, the slot serves again.
        wait_for(lambda: worker.runner.abandoned == 0, message="cancelled task ended")
        after = enqueue(store, dispatcher, "t.async.record", {"tag": "after"})
        wait_status(store, after, "succeeded")
    assert outcomes(store, job) == ["timeout"]
    assert "TimeoutError: handler ran past its timeout of 0.3 s" in store.get_job(
        job.id).last_error


def test_coroutines_ignoring_cancellation_are_written_off_then_recycle_the_worker(
        settings, store, dispatcher):
    first = enqueue(store, dispatcher, "t.async.stubborn", {"gate": "never"}, timeout_s=0.2,
                    max_retries=0)
    runner = WorkerThread(settings, concurrency=1)
    worker = runner.start()
    try:
        wait_status(store, first, "dead")
        assert worker.runner.abandoned == 1
        wait_for(lambda: sample("taskline_worker_abandoned_handlers",
                                worker=worker.worker_id) == 1, message="abandoned exported")
        # Its permit came back at the timeout: the one slot runs the next job meanwhile.
        after = enqueue(store, dispatcher, "t.record", {"tag": "after"})
        wait_status(store, after, "succeeded")
        enqueue(store, dispatcher, "t.async.stubborn", {"gate": "never"}, timeout_s=0.2,
                max_retries=0)
        runner.thread.join(15)
        assert not runner.thread.is_alive(), "the worker did not stop to recycle"
    finally:
        th.open_all_gates()
        if runner.thread.is_alive():
            runner.stop()
    assert runner.exit is Exit.RECYCLE
    assert outcomes(store, first) == ["timeout"]


def test_a_running_coroutine_is_cancelled_cooperatively(settings, store, dispatcher):
    job = enqueue(store, dispatcher, "t.async.block", {"gate": "never"})
    with running_worker(settings):
        wait_status(store, job, "running")
        assert store.cancel_running_job(job.id) is not None
        wait_status(store, job, "cancelled")
    assert outcomes(store, job) == ["cancelled"]
    assert events(store, job)[-2:] == ["cancel_requested", "cancelled"]


def test_a_zombie_coroutine_completion_changes_nothing(settings, store, dispatcher):
    job = enqueue(store, dispatcher, "t.async.block", {"gate": "g"})
    stale = sample("job_stale_completions_total", queue="default")
    with running_worker(settings):
        wait_status(store, job, "running")
        steal_lease(store, job)
        th.release("g")
        wait_for(lambda: sample("job_stale_completions_total", queue="default") > stale,
                 message="stale completion counted")
    assert status_of(store, job) == "queued" and store.get_job(job.id).result is None
    assert outcomes(store, job) == ["lost"]


def test_a_coroutine_whose_lease_cannot_be_renewed_self_fences(settings, store, dispatcher,
                                                                database_url):
    fast = settings.replace(lease_s=1.5, heartbeat_s=0.3)
    fenced = enqueue(store, dispatcher, "t.async.block", {"gate": "never"})
    with running_worker(fast) as worker:
        wait_status(store, fenced, "running")
        with refusing_connections(database_url):
            wait_for(lambda: worker.fence.tripped, message="self-fenced")
            wait_for(lambda: len(worker.attempts) == 0, message="attempt dropped")
        store.engine.dispose()  # the test's pooled connections were cut too
        wait_for(lambda: not worker.fence.tripped, message="fence lifted")
        after = enqueue(store, dispatcher, "t.async.record", {"tag": "after"})
        wait_status(store, after, "succeeded")
    # Nothing was recorded for the fenced attempt: the reaper will recover it.
    assert status_of(store, fenced) == "running"
    assert outcomes(store, fenced) == [None]


def test_shutdown_finishes_coroutines_within_the_grace_and_hands_back_the_rest(
        settings, store, dispatcher):
    quick = enqueue(store, dispatcher, "t.async.sleep", {"sleep_s": 0.5})
    deaf = enqueue(store, dispatcher, "t.async.stubborn", {"gate": "never"})
    runner = WorkerThread(settings.replace(shutdown_grace_s=1.5), concurrency=2)
    runner.start()
    try:
        wait_for(lambda: status_of(store, quick) == status_of(store, deaf) == "running",
                 message="both running")
        runner.stop()
    finally:
        th.open_all_gates()
    assert runner.exit is Exit.STOPPED
    assert status_of(store, quick) == "succeeded"
    assert released(store, deaf)


@pytest.fixture
def hook_log(store):
    with store.engine.begin() as conn:
        conn.execute(text("CREATE TABLE hook_log (job_id uuid, attempt int)"))

    def rows() -> list[tuple]:
        with store.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text("SELECT job_id, attempt FROM hook_log"))]

    return rows


def test_coroutine_completion_hooks_commit_with_the_completion(settings, store, dispatcher,
                                                                hook_log):
    job = enqueue(store, dispatcher, "t.async.hook")
    broken = enqueue(store, dispatcher, "t.async.hook", {"hook_fails": True}, max_retries=0)
    with running_worker(settings):
        wait_status(store, job, "succeeded")
        wait_status(store, broken, "dead")
    assert hook_log() == [(job.id, 1)]
    assert "division by zero" in store.get_job(broken.id).last_error
    assert outcomes(store, broken) == ["failed"]


def test_thread_and_coroutine_handlers_share_the_concurrency(settings, store, dispatcher):
    jobs = [enqueue(store, dispatcher, kind, {"tag": f"{kind}-{n}", "sleep_s": 0.1})
            for n in range(6) for kind in ("t.held", "t.async.held")]
    with running_worker(settings, concurrency=3):
        for job in jobs:
            wait_status(store, job, "succeeded")
    assert th.PEAK[th.ANY] <= 3
    assert th.PEAK["t.async.held"] >= 2, "coroutines never overlapped on the loop"
    assert ah.THREADS["t.async.held-0"] == LOOP_THREAD
    assert ah.THREADS.get("t.held-0") is None  # thread handlers never ran on the loop


def test_a_blocked_loop_delays_neither_renewal_nor_timeouts(settings, store, dispatcher):
    fast = settings.replace(lease_s=1.0, heartbeat_s=0.3)
    renewals = sample("job_lease_renewals_total", result="ok")
    # Holds the loop for two lease periods; only renewal from another thread keeps it.
    blocker = enqueue(store, dispatcher, "t.async.blocking", {"block_s": 2.0}, timeout_s=30)
    with running_worker(fast, concurrency=2) as worker:
        wait_for(ah.BLOCKING.is_set, message="the loop is blocked")
        first = store.get_history(blocker.id)[1][0]
        # Handed to the blocked loop, this one never starts; its timeout still passes.
        starved = enqueue(store, dispatcher, "t.async.sleep", {"sleep_s": 5}, timeout_s=0.3,
                          max_retries=0)
        wait_status(store, starved, "dead")
        assert ah.BLOCKING.is_set(), "the timeout waited for the loop"
        # An operator sees the loop held, from the heartbeat's gauge.
        wait_for(lambda: sample("taskline_worker_event_loop_lag_seconds",
                                worker=worker.worker_id) >= 0.5, message="loop lag exported")
        wait_status(store, blocker, "succeeded")
    lease = store.get_history(blocker.id)[1][0]
    assert lease["leased_until"] > first["leased_until"]
    assert outcomes(store, blocker) == ["succeeded"]
    assert outcomes(store, starved) == ["timeout"]
    assert sample("job_lease_renewals_total", result="ok") - renewals >= 2


def test_a_coroutine_blocking_the_loop_past_its_timeout_is_failed_meanwhile(settings, store,
                                                                             dispatcher):
    fast = settings.replace(lease_s=1.0, heartbeat_s=0.3)
    job = enqueue(store, dispatcher, "t.async.blocking", {"block_s": 2.0}, timeout_s=0.4,
                  max_retries=0)
    with running_worker(fast):
        wait_status(store, job, "dead")
        assert ah.BLOCKING.is_set(), "the timeout waited for the loop"
    assert outcomes(store, job) == ["timeout"]


def test_run_handler_runs_a_coroutine_handler_to_its_end():
    assert run_handler("t.async.record", {"tag": "direct"}) == {"tag": "direct", "attempt": 1}
    assert ah.THREADS["direct"] != LOOP_THREAD  # a loop of its own, not a worker's
    with pytest.raises(RuntimeError, match="flaky"):
        run_handler("t.async.fail", {"error": "flaky"})


def test_run_handler_works_inside_a_running_event_loop():
    async def from_a_coroutine() -> object:
        return run_handler("t.async.sleep", {"sleep_s": 0.01})

    assert asyncio.run(from_a_coroutine()) == {"slept": 0.01}


def test_drain_runs_coroutine_handlers_with_retries_and_hooks(database_url, store, hook_log):
    with psycopg.connect(database_url) as conn:
        ok = taskline.enqueue(conn, "t.async.hook", {})
        doomed = taskline.enqueue(conn, "t.async.fail", {"error": "flaky"}, max_retries=1)
    drained = drain(database_url)
    assert (drained.succeeded, drained.retried, drained.dead) == (1, 1, 1)
    assert hook_log() == [(ok, 1)]
    assert store.get_job(doomed).last_error == "RuntimeError: flaky"
