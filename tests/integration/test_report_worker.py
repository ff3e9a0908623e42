"""The built-in `report` handler run by a real worker: its summary becomes the job's result, a
malformed payload is dead-lettered at once, and a cancelled report stops mid-way."""

from __future__ import annotations

from taskline.handlers.builtin import REPORT_MAX_SIZE
from tests.helpers import enqueue, wait_for
from tests.integration.worker_handlers import running_worker


def _terminal(store, job_id):
    job = store.get_job(job_id)
    return job if job.status.terminal else None


def test_a_report_job_succeeds_with_its_summary_as_result(settings, store, dispatcher):
    job = enqueue(store, dispatcher, "report", {"size": 20000, "groups": 3, "seed": 1, "top": 2})
    with running_worker(settings, concurrency=1):
        done = wait_for(lambda: _terminal(store, job.id), timeout=30, message="the report")
    assert done.status.value == "succeeded", done.last_error
    assert done.result["rows"] == 20000 and sorted(done.result["groups"]) == ["g000", "g001",
                                                                              "g002"]
    assert len(done.result["top"]) == 2 and done.attempts == 1


def test_a_malformed_report_is_dead_lettered_without_retries(settings, store, dispatcher):
    job = enqueue(store, dispatcher, "report", {"size": -5}, max_retries=3)
    with running_worker(settings, concurrency=1):
        done = wait_for(lambda: _terminal(store, job.id), timeout=30, message="the dead letter")
    assert done.status.value == "dead" and done.attempts == 1
    assert "size" in done.last_error


def test_a_running_report_stops_when_cancelled(settings, store, dispatcher):
    job = enqueue(store, dispatcher, "report", {"size": REPORT_MAX_SIZE})
    with running_worker(settings, concurrency=1):
        wait_for(lambda: store.get_job(job.id).status.value == "running", timeout=30,
                 message="the report to start")
        assert store.cancel_running_job(job.id) is not None
        done = wait_for(lambda: _terminal(store, job.id), timeout=30, message="the cancel")
    assert done.status.value == "cancelled"
