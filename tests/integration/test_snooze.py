"""Snooze against real PostgreSQL (taskline.testing.drain and a real worker, both through the
worker's own Recorder): `raise taskline.Snooze(delay_s)` puts the job back to `scheduled` for
`delay_s` without consuming an attempt (event `snoozed`, lease outcome `snoozed`, `snoozes`
counted); past TASKLINE_MAX_SNOOZES the job is dead with a clear error; a non-number snooze is
a TypeError at the raise; an ordering key's job keeps its place while snoozed."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import psycopg
import pytest
from sqlalchemy import text

import taskline
from taskline.handlers.registry import handler
from taskline.testing import drain
from taskline_maintenance.promoter import Promoter
from tests.helpers import wait_for
from tests.integration.worker_handlers import running_worker

RUNS: list[str] = []


@handler("ts.snoozy")
def snoozy(payload: Any, ctx: Any) -> str:
    """Snoozes `times` times (counted in RUNS per name), then succeeds."""
    name = payload["name"]
    RUNS.append(name)
    if RUNS.count(name) <= payload.get("times", 0):
        raise taskline.Snooze(payload.get("delay_s", 0))
    return f"{name} ran at attempt {ctx.attempt}"


@pytest.fixture(autouse=True)
def _runs():
    RUNS.clear()
    yield
    RUNS.clear()


def commit(database_url: str, payload: dict, **fields) -> Any:
    with psycopg.connect(database_url) as conn:
        return taskline.enqueue(conn, "ts.snoozy", payload, **fields)


def history(store, job_id) -> tuple[list[str], list[tuple[int, str]]]:
    with store.transaction() as conn:
        events = conn.execute(text("SELECT event FROM taskline.job_events WHERE job_id = :id "
                                   "ORDER BY id"), {"id": job_id}).scalars().all()
        leases = conn.execute(text("SELECT attempt, outcome FROM taskline.job_leases "
                                   "WHERE job_id = :id ORDER BY id"), {"id": job_id}).all()
    return list(events), [tuple(r) for r in leases]


def test_a_snooze_reschedules_without_consuming_an_attempt(database_url, store):
    job_id = commit(database_url, {"name": "a", "times": 2}, max_retries=0)
    drained = drain(database_url)
    assert (drained.snoozed, drained.succeeded) == (2, 1)
    job = store.get_job(job_id)
    assert (job.status.value, job.attempts, job.snoozes) == ("succeeded", 1, 2)
    assert job.result == "a ran at attempt 1"
    events, leases = history(store, job_id)
    assert events == ["enqueued", "claimed", "snoozed", "promoted", "claimed", "snoozed",
                      "promoted", "claimed", "succeeded"]
    assert leases == [(1, "snoozed"), (1, "snoozed"), (1, "succeeded")]


def test_past_the_most_snoozes_the_job_is_dead_with_the_cause(database_url, store, settings):
    job_id = commit(database_url, {"name": "b", "times": 10}, max_retries=5)
    drained = drain(database_url, settings=replace(settings, max_snoozes=2))
    assert (drained.snoozed, drained.dead) == (2, 1)
    job = store.get_job(job_id)
    assert (job.status.value, job.attempts) == ("dead", 1)  # no retry: a snooze loop is not one
    assert "snoozed more than TASKLINE_MAX_SNOOZES (2) times" in job.last_error


@pytest.mark.parametrize("bad", ["soon", None, -1, float("nan"), True, 10 ** 12])
def test_a_snooze_that_is_not_a_number_of_seconds_is_a_type_error(bad):
    with pytest.raises(TypeError, match="Snooze"):
        taskline.Snooze(bad)


def test_a_snoozed_job_waits_out_its_delay_and_keeps_its_keys_place(settings, store, dispatcher,
                                                                   database_url):
    first = commit(database_url, {"name": "first", "times": 1, "delay_s": 0.5},
                   ordering_key="acct")
    second = commit(database_url, {"name": "second"}, ordering_key="acct")
    promoter = Promoter(store, dispatcher, settings)  # maintenance's: the snooze ends due

    def done() -> bool:
        promoter.run_once()
        return store.get_job(second).status.value == "succeeded"

    with running_worker(settings, concurrency=2):
        wait_for(done, timeout=20, message="both ran")
    assert RUNS == ["first", "first", "second"]  # the one behind waited out the snooze
    with store.transaction() as conn:
        gap = conn.execute(text(
            "SELECT extract(epoch FROM b.leased_at - a.released_at) FROM taskline.job_leases a "
            "JOIN taskline.job_leases b ON b.job_id = a.job_id AND b.id > a.id "
            "WHERE a.job_id = :id AND a.outcome = 'snoozed'"), {"id": first}).scalar_one()
    assert gap >= 0.5
    assert store.get_job(first).attempts == 1
