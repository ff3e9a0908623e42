"""Structured logs of the three services, as an operator's log pipeline reads them.

The real `taskline api`, `worker` and `maintenance` run as subprocesses with JSON logs over a
small workload (a success, a retry, a dead letter, a delayed job cancelled): every line each
one writes must be one JSON object naming its service, and every job-path event (enqueued,
scheduled, cancelled, claimed, succeeded, retry_scheduled, dead_lettered, promoted) must carry
the same fields: service, event, job_id, queue, type, attempt, worker on the worker's events,
duration_s once a handler ran, error when it failed. With TASKLINE_LOG_FORMAT=text the same
events are readable lines for `make run`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests

from taskline.settings import Settings
from taskline.store.store import Store
from tests.helpers import enqueue, service, service_env, wait_for
from tests.servers import free_port

WORKER_EVENTS = {"claimed", "succeeded", "retry_scheduled", "dead_lettered"}
RAN = {"succeeded", "retry_scheduled", "dead_lettered"}
FAILED = {"retry_scheduled", "dead_lettered"}


@contextmanager
def stack(settings: Settings, log_dir: Path) -> Iterator[str]:
    """api, worker and maintenance with JSON logs; yields the API's URL."""
    port = free_port()
    env = service_env(settings, TASKLINE_LOG_FORMAT="json")
    with ExitStack() as services:
        services.enter_context(service(["api", "--bind", f"127.0.0.1:{port}", "--workers", "1"],
                                       env, log_dir))
        services.enter_context(service(["worker", "--concurrency", "2"], env, log_dir))
        services.enter_context(service(["maintenance"], env, log_dir))
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _answers(url + "/healthz"), timeout=20, message="the api")
        yield url


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=1).status_code == 200
    except requests.RequestException:
        return False


def post(url: str, body: dict[str, Any]) -> str:
    response = requests.post(url + "/api/v1/jobs", json=body, timeout=10)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def status(store: Store, job_id: str) -> str:
    return store.get_job(uuid.UUID(job_id)).status.value


def run_workload(url: str, store: Store) -> dict[str, str]:
    """Enqueue one job of each kind and wait until each has ended; returns their ids."""
    jobs = {
        "ok": post(url, {"type": "echo", "payload": {"hello": "logs"}}),
        "retried": post(url, {"type": "simulate", "payload": {"fail_first": 1},
                              "max_retries": 2}),
        "dead": post(url, {"type": "simulate", "max_retries": 0,
                           "payload": {"fail_first": 1, "non_retryable": True,
                                       "error": "bad input"}}),
        "cancelled": post(url, {"type": "echo", "delay_s": 300}),
    }
    assert requests.delete(f"{url}/api/v1/jobs/{jobs['cancelled']}", timeout=10).ok
    ended = {"ok": "succeeded", "retried": "succeeded", "dead": "dead", "cancelled": "cancelled"}
    wait_for(lambda: all(status(store, jobs[k]) == s for k, s in ended.items()), timeout=20,
             message="every job ended")
    return jobs


def records(log_dir: Path, service_name: str) -> list[dict[str, Any]]:
    """Every line `service_name` wrote, parsed; a line that is not a JSON object fails."""
    (path,) = log_dir.glob(f"{service_name}-*.log")
    parsed = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            record = json.loads(line)
        except ValueError:
            pytest.fail(f"{path.name}:{number} is not JSON: {line[:200]}")
        assert isinstance(record, dict), line
        assert {"ts", "level", "service", "logger", "msg"} <= record.keys(), line
        assert record["service"] == service_name, line
        parsed.append(record)
    return parsed


def events_of(found: list[dict[str, Any]], job_id: str) -> list[tuple[str, int]]:
    return [(r["event"], r["attempt"]) for r in found if r.get("job_id") == job_id]


def check_job_fields(record: dict[str, Any]) -> None:
    assert record["event"] == record["action"]
    uuid.UUID(record["job_id"])
    assert record["queue"] == "default" and record["type"] in {"echo", "simulate"}
    assert isinstance(record["attempt"], int)


def check_worker_fields(record: dict[str, Any]) -> None:
    check_job_fields(record)
    assert record["worker"] and record["attempt"] >= 1
    if record["event"] in RAN:
        assert isinstance(record["duration_s"], float) and record["duration_s"] >= 0
    if record["event"] in FAILED:
        assert record["error"].startswith(("RuntimeError", "NonRetryableError"))


def test_every_service_logs_one_json_event_per_line_with_the_job_fields(
        settings: Settings, store: Store, tmp_path: Path):
    with stack(settings, tmp_path) as url:
        jobs = run_workload(url, store)
    api, worker, maintenance = (records(tmp_path, s) for s in ("api", "worker", "maintenance"))

    job_events = [r for r in api if r.get("job_id")]
    for record in job_events:
        check_job_fields(record)
    assert events_of(job_events, jobs["ok"]) == [("enqueued", 0)]
    assert events_of(job_events, jobs["cancelled"]) == [("scheduled", 0), ("cancelled", 0)]

    job_events = [r for r in worker if r.get("event") in WORKER_EVENTS]
    for record in job_events:
        check_worker_fields(record)
    assert events_of(job_events, jobs["ok"]) == [("claimed", 1), ("succeeded", 1)]
    assert events_of(job_events, jobs["retried"]) == [
        ("claimed", 1), ("retry_scheduled", 1), ("claimed", 2), ("succeeded", 2)]
    assert events_of(job_events, jobs["dead"]) == [("claimed", 1), ("dead_lettered", 1)]
    (dead,) = [r for r in job_events if r["event"] == "dead_lettered"]
    assert dead["level"] == "error" and dead["error"] == "NonRetryableError: bad input"

    promoted = [r for r in maintenance if r.get("event") == "promoted"]
    assert [r["job_id"] for r in promoted] == [jobs["retried"]]
    assert promoted[0]["queue"] == "default"


def test_text_logs_are_readable_lines_with_the_same_fields(settings: Settings, store: Store,
                                                           dispatcher, tmp_path: Path):
    env = service_env(settings, TASKLINE_LOG_FORMAT="text")
    with service(["worker", "--concurrency", "1"], env, tmp_path):
        job_id = str(enqueue(store, dispatcher, "echo").id)
        wait_for(lambda: status(store, job_id) == "succeeded", message="the job ran")
    (path,) = tmp_path.glob("worker-*.log")
    lines = path.read_text().splitlines()
    assert not any(line.startswith("{") for line in lines)
    (succeeded,) = [line for line in lines if f"job_id={job_id}" in line and "succeeded" in line]
    assert " INFO " in succeeded and "taskline.execution.outcomes: job succeeded" in succeeded
    assert "attempt=1" in succeeded and "duration_s=" in succeeded and "worker=" in succeeded
