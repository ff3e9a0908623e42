"""Progress against real PostgreSQL, through the worker's own code (taskline.testing.drain):
`ctx.progress(value)` writes at most once a second under the attempt's lease, the last value
always before the outcome; the job shows it as `progress` (GET /api/v1/jobs/{id}) and the
event stream carries each written value; a bad value raises in the handler and writes nothing;
a value sent after the lease is gone is refused by the fence."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import taskline
from taskline.events import Change
from taskline.handlers.registry import handler
from taskline.testing import drain
from tests.helpers import enqueue, succeed

SEEN: list[str] = []


@handler("tp.steps")
def steps(payload: Any, ctx: Any) -> str:
    """Reports 0.1, 0.5 and then {"step": 3} at once: the first is written, the last flushed."""
    for value in payload.get("values", []):
        try:
            ctx.progress(value)
        except (TypeError, ValueError) as err:
            SEEN.append(type(err).__name__)
    return "done"


@pytest.fixture(autouse=True)
def _seen():
    SEEN.clear()
    yield
    SEEN.clear()


def commit(database_url: str, values: list) -> Any:
    with psycopg.connect(database_url) as conn:
        return taskline.enqueue(conn, "tp.steps", {"values": values})


def progress_events(store, job_id) -> list[Any]:
    return [c.progress for c in map(Change.from_row, store.events_after(0, 100))
            if c.job_id == str(job_id) and c.event == "progress"]


def test_the_first_value_is_written_and_the_last_one_before_the_outcome(database_url, store,
                                                                         client):
    job_id = commit(database_url, [0.1, 0.5, {"step": 3}])
    assert drain(database_url).succeeded == 1
    job = client.get(f"/api/v1/jobs/{job_id}").get_json()
    assert job["progress"] == {"step": 3}
    assert [e["event"] for e in job["events"]] == ["enqueued", "claimed", "progress", "progress",
                                                   "succeeded"]
    assert progress_events(store, job_id) == [0.1, {"step": 3}]  # the held 0.5 was replaced


def test_a_bad_value_raises_in_the_handler_and_writes_nothing(database_url, store):
    job_id = commit(database_url, [1.5, True, {"x": "y" * 5000}, "half"])
    assert drain(database_url).succeeded == 1
    assert SEEN == ["ValueError", "TypeError", "ValueError", "TypeError"]
    assert store.get_job(job_id).progress is None
    assert progress_events(store, job_id) == []


def test_a_value_sent_after_the_lease_ended_is_refused_by_the_fence(store):
    job = enqueue(store, None, "tp.steps", push=False)
    (claimed,) = store.claim_jobs([job.id], "w1", 30)
    assert store.write_progress(claimed.lease_id, "w1", 0.5)
    assert not store.write_progress(claimed.lease_id, "w2", 0.6)  # not its lease
    succeed(store, claimed.lease_id, "w1")
    assert not store.write_progress(claimed.lease_id, "w1", 0.9)  # the lease is gone
    assert store.get_job(job.id).progress == 0.5
