"""How the worker records outcomes against real PostgreSQL and Redis: retries scheduled at the
PostgreSQL due time, dead letters, timeouts, cooperative cancel, fencing of a zombie's
completion, lease renewal, completion hooks, and recycling after abandoned threads."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import text

from taskline.dispatch.keys import QueueKeys
from taskline_worker.worker import Exit
from tests.helpers import enqueue, wait_for
from tests.integration import worker_handlers as th
from tests.integration.worker_handlers import WorkerThread, running_worker

Q = QueueKeys("default")


pytestmark = pytest.mark.usefixtures("clean_handlers")


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def status_of(store, job) -> str:
    return store.get_job(job.id).status.value


def wait_status(store, job, status: str, timeout: float = 10.0) -> None:
    wait_for(lambda: status_of(store, job) == status, timeout=timeout,
             message=f"job {status}")


def outcomes(store, job) -> list[str | None]:
    return [lease["outcome"] for lease in store.get_history(job.id)[1]]


def events(store, job) -> list[str]:
    return [event["event"] for event in store.get_history(job.id)[0]]


def steal_lease(store, job) -> None:
    """Do what the reaper does to an expired lease: close it and requeue the job."""
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE taskline.job_leases SET released_at = now(), outcome = 'lost' "
                          "WHERE job_id = :id AND released_at IS NULL"), {"id": job.id})
        conn.execute(text("UPDATE taskline.jobs SET status = 'queued' WHERE id = :id"),
                     {"id": job.id})


def promote_due(store, dispatcher) -> int:
    """What the promoter does: due retries to queued in PostgreSQL, then to ready in Redis."""
    rows = store.promote_due(100)
    for row in rows:
        dispatcher.promote(row.queue, row.priority, [str(row.id)])
    return len(rows)


def test_a_failure_schedules_a_retry_at_the_postgresql_due_time(settings, store, dispatcher):
    job = enqueue(store, dispatcher, "t.fail", {"error": "flaky"}, max_retries=2)
    with running_worker(settings) as worker:
        wait_status(store, job, "retrying")
        wait_for(lambda: dispatcher.client.zscore(Q.retry, str(job.id)) is not None,
                 message="id in the retry set")
        assert dispatcher.client.llen(Q.processing(worker.worker_id)) == 0
    with store.engine.connect() as conn:
        due_ms, delay_s = conn.execute(text(
            "SELECT (extract(epoch FROM next_run_at) * 1000)::bigint, "
            "extract(epoch FROM next_run_at - updated_at) FROM taskline.jobs WHERE id = :id"),
            {"id": job.id}).one()
    assert dispatcher.client.zscore(Q.retry, str(job.id)) == due_ms
    # Backoff base 0.2 s, jittered on the upper half.
    assert 0.09 <= float(delay_s) <= 0.21
    failed = store.get_job(job.id)
    assert failed.attempts == 1 and failed.last_error == "RuntimeError: flaky"
    history, _ = store.get_history(job.id)
    assert [e["event"] for e in history] == ["enqueued", "claimed", "retry_scheduled"]
    assert "flaky" in history[-1]["detail"]["traceback"]
    assert outcomes(store, job) == ["failed"]


def test_exhausted_non_retryable_and_unknown_jobs_are_dead_lettered(settings, store,
                                                                     dispatcher):
    exhausted = enqueue(store, dispatcher, "t.fail", max_retries=1)
    fatal = enqueue(store, dispatcher, "t.fatal", max_retries=3)
    unknown = enqueue(store, dispatcher, "no.such.type", max_retries=3)
    with running_worker(settings):
        wait_status(store, exhausted, "retrying")
        wait_for(lambda: promote_due(store, dispatcher), message="retry due")
        for job in (exhausted, fatal, unknown):
            wait_status(store, job, "dead")
    expected = {exhausted.id: (2, "RuntimeError: boom"),
                fatal.id: (1, "NonRetryableError: cannot ever work"),
                unknown.id: (1, "NoHandler: no handler registered for type no.such.type")}
    with store.engine.connect() as conn:
        rows = conn.execute(text("SELECT job_id, attempts, final_error FROM "
                                 "taskline.dead_letter_jobs"))
        assert {r.job_id: (r.attempts, r.final_error) for r in rows} == expected
    assert set(dispatcher.client.lrange(Q.dlq, 0, -1)) == {str(exhausted.id), str(fatal.id),
                                                          str(unknown.id)}
    assert outcomes(store, exhausted) == ["failed", "failed"]
    assert events(store, fatal)[-1] == "dead_lettered"
    assert store.get_job(unknown.id).last_error == expected[unknown.id][1]


def test_a_handler_past_its_timeout_is_failed_and_abandoned(settings, store, dispatcher):
    retried = enqueue(store, dispatcher, "t.stubborn", {"gate": "never"}, timeout_s=0.3,
                      max_retries=1)
    dead = enqueue(store, dispatcher, "t.stubborn", {"gate": "never"}, timeout_s=0.3,
                   max_retries=0)
    timeouts = sample("job_failed_total", type="t.stubborn", queue="default", reason="timeout")
    with running_worker(settings, concurrency=2) as worker:
        wait_status(store, retried, "retrying")
        wait_status(store, dead, "dead")
        assert worker.runner.abandoned == 2
        # Both threads were written off and replaced: the worker still runs new jobs.
        after = enqueue(store, dispatcher, "echo", {"n": 1})
        wait_status(store, after, "succeeded")
    for job in (retried, dead):
        _, leases = store.get_history(job.id)
        assert [lease["outcome"] for lease in leases] == ["timeout"]
        assert leases[0]["released_at"] is not None
        assert "TimeoutError: handler ran past its timeout of 0.3 s" in store.get_job(
            job.id).last_error
    assert sample("job_failed_total", type="t.stubborn", queue="default",
                  reason="timeout") - timeouts == 2


def test_abandoned_threads_beyond_the_slots_recycle_the_worker(settings, store, dispatcher):
    for _ in range(2):
        enqueue(store, dispatcher, "t.stubborn", {"gate": "never"}, timeout_s=0.2,
                max_retries=0)
    runner = WorkerThread(settings, concurrency=1)
    worker = runner.start()
    try:
        runner.thread.join(15)
        assert not runner.thread.is_alive(), "the worker did not stop to recycle"
    finally:
        th.open_all_gates()
        if runner.thread.is_alive():
            runner.stop()
    assert runner.exit is Exit.RECYCLE
    with store.engine.connect() as conn:
        stopped = conn.execute(text("SELECT stopped_at FROM taskline.workers WHERE id = :id"),
                               {"id": worker.worker_id}).scalar_one()
    assert stopped is not None


def test_a_running_job_is_cancelled_cooperatively(settings, store, dispatcher):
    job = enqueue(store, dispatcher, "t.block", {"gate": "never"})
    with running_worker(settings) as worker:
        wait_status(store, job, "running")
        assert store.cancel_running_job(job.id) is not None
        wait_status(store, job, "cancelled")
        assert dispatcher.client.llen(Q.processing(worker.worker_id)) == 0
    assert outcomes(store, job) == ["cancelled"]
    assert events(store, job)[-2:] == ["cancel_requested", "cancelled"]


def test_a_handler_that_finishes_despite_a_cancel_request_succeeds(settings, store,
                                                                   dispatcher):
    job = enqueue(store, dispatcher, "t.stubborn", {"gate": "g"})
    with running_worker(settings) as worker:
        wait_status(store, job, "running")
        store.cancel_running_job(job.id)
        wait_for(lambda: any(a.ctx.stopping for a in worker.attempts.snapshot()),
                 message="cancel seen by the renewal")
        th.release("g")
        wait_status(store, job, "succeeded")
    assert store.get_job(job.id).result == {"stubborn": True, "stopping": True}


def test_a_zombie_completion_changes_nothing(settings, store, dispatcher):
    job = enqueue(store, dispatcher, "t.stubborn", {"gate": "g"})
    stale = sample("job_stale_completions_total", queue="default")
    with running_worker(settings) as worker:
        wait_status(store, job, "running")
        steal_lease(store, job)
        th.release("g")
        wait_for(lambda: sample("job_stale_completions_total", queue="default") > stale,
                 message="stale completion counted")
        wait_for(lambda: dispatcher.client.llen(Q.processing(worker.worker_id)) == 0,
                 message="id acked")
    zombie = store.get_job(job.id)
    assert zombie.status.value == "queued" and zombie.result is None
    assert outcomes(store, job) == ["lost"]
    assert "succeeded" not in events(store, job)


def test_leases_are_renewed_while_a_handler_outlives_them(settings, store, dispatcher):
    fast = settings.replace(lease_s=1.0, heartbeat_s=0.3)
    job = enqueue(store, dispatcher, "t.block", {"gate": "g"})
    renewals = sample("job_lease_renewals_total", result="ok")
    with running_worker(fast):
        wait_status(store, job, "running")
        first = store.get_history(job.id)[1][0]

        def outlived() -> bool:
            with store.engine.connect() as conn:
                return conn.execute(text("SELECT now() > :at"),
                                    {"at": first["leased_at"]
                                     + (first["leased_until"] - first["leased_at"]) * 2}
                                    ).scalar_one()

        wait_for(outlived, message="twice the lease has passed")
        lease = store.get_history(job.id)[1][0]
        assert status_of(store, job) == "running"
        assert lease["released_at"] is None and lease["leased_until"] > first["leased_until"]
        th.release("g")
        wait_status(store, job, "succeeded")
    assert outcomes(store, job) == ["succeeded"]
    assert sample("job_lease_renewals_total", result="ok") - renewals >= 2


@pytest.fixture
def hook_log(store):
    with store.engine.begin() as conn:
        conn.execute(text("CREATE TABLE hook_log (job_id uuid, attempt int)"))

    def rows() -> list[tuple]:
        with store.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text("SELECT job_id, attempt FROM hook_log"))]

    return rows


def test_completion_hooks_commit_with_the_completion(settings, store, dispatcher, hook_log):
    job = enqueue(store, dispatcher, "t.hook")
    broken = enqueue(store, dispatcher, "t.hook", {"hook_fails": True}, max_retries=0)
    with running_worker(settings):
        wait_status(store, job, "succeeded")
        wait_status(store, broken, "dead")
    assert hook_log() == [(job.id, 1)]
    # A failing hook rolls the completion back with it: the attempt is a failure.
    assert "division by zero" in store.get_job(broken.id).last_error
    assert outcomes(store, broken) == ["failed"]


def test_completion_hooks_of_a_zombie_never_commit(settings, store, dispatcher, hook_log):
    job = enqueue(store, dispatcher, "t.hook", {"gate": "g"})
    stale = sample("job_stale_completions_total", queue="default")
    with running_worker(settings):
        wait_status(store, job, "running")
        steal_lease(store, job)
        th.release("g")
        wait_for(lambda: sample("job_stale_completions_total", queue="default") > stale,
                 message="stale completion counted")
    assert hook_log() == []
    assert status_of(store, job) == "queued"
