"""The event-stream model: states after each event, rows as changes, release in id order."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

import pytest

from taskline.events import Change, Horizon, Sequencer, status_after
from taskline.jobs import Event, Status
from taskline.transitions import STATUS_AFTER

ROW = {"id": 7, "job_id": uuid.UUID("5d0c2f9e-8a9b-4c3e-9f51-0b6f3f1f2a10"), "attempt": 2,
       "event": "retry_scheduled", "worker_id": "w-1", "actor": "ops", "recorded_status": None,
       "created_at": datetime(2026, 1, 2, 4, 4, 5, 120, tzinfo=timezone(timedelta(hours=1))),
       "queue": "mail", "type": "send", "priority": 7, "error": "Boom: x"}


def test_every_event_has_a_known_outcome() -> None:
    # Every event a move writes has a state after it; the rest record and move nothing.
    assert set(STATUS_AFTER) == set(Event) - {Event.FAILED, Event.CANCEL_REQUESTED,
                                              Event.RESTORED, Event.JOINED, Event.REPLACED,
                                              Event.PROGRESS}
    assert STATUS_AFTER[Event.RECOVERED] is None  # its row records which
    assert status_after("claimed") == "running"
    assert status_after("dead_lettered") == "dead"
    assert status_after("cancel_requested") is None  # still running until the worker stops
    assert status_after("progress") is None  # a running handler's report moves nothing


@pytest.mark.parametrize("recorded", [s.value for s in Status])
def test_recovered_takes_the_state_the_reaper_recorded(recorded: str) -> None:
    assert status_after("recovered", recorded) == recorded


def test_recovered_without_a_valid_state_moves_nowhere() -> None:
    assert status_after("recovered", None) is None
    assert status_after("recovered", "limbo") is None
    assert status_after("no_such_event") is None


def test_a_row_becomes_a_change() -> None:
    change = Change.from_row(ROW)
    assert change.status == "retrying" and change.error == "Boom: x" and change.id == 7
    assert change.created_at == "2026-01-02T03:04:05.000120Z"  # UTC, whatever the session's zone
    data = json.loads(change.to_json())
    assert data == {"id": 7, "job_id": "5d0c2f9e-8a9b-4c3e-9f51-0b6f3f1f2a10", "attempt": 2,
                    "event": "retry_scheduled", "status": "retrying", "worker_id": "w-1",
                    "actor": "ops",
                    "created_at": "2026-01-02T03:04:05.000120Z", "queue": "mail", "type": "send",
                    "priority": 7, "error": "Boom: x", "progress": None}


def test_a_row_of_a_deleted_job_has_no_queue() -> None:
    change = Change.from_row({**ROW, "queue": None, "type": None, "priority": None})
    assert (change.queue, change.type, change.priority) == (None, None, None)


class Horizons:
    """A fake transaction horizon that counts how often it is read."""

    def __init__(self, oldest: int, next_: int) -> None:
        self.value: Horizon = (oldest, next_)
        self.reads = 0

    def __call__(self) -> Horizon:
        self.reads += 1
        return self.value


def release(seq: Sequencer, ids: list[int], horizon: Callable[[], Horizon],
            now: float = 0.0) -> list[int]:
    return seq.release(ids, horizon, now)


def test_contiguous_ids_are_released_without_reading_the_horizon() -> None:
    seq, horizon = Sequencer(10, max_wait_s=5), Horizons(100, 110)
    assert release(seq, [11, 12, 13], horizon) == [11, 12, 13]
    assert seq.cursor == 13 and not seq.waiting and horizon.reads == 0


def test_ids_after_a_gap_wait_until_it_is_filled() -> None:
    seq, horizon = Sequencer(10, max_wait_s=5), Horizons(100, 110)
    assert release(seq, [11, 13, 14], horizon) == [11]
    assert seq.waiting and horizon.reads == 1
    assert release(seq, [13, 14], horizon, now=1) == []
    assert release(seq, [12, 13, 14], horizon, now=2) == [12, 13, 14]
    assert seq.cursor == 14 and not seq.waiting


def test_a_gap_is_skipped_once_every_transaction_that_could_fill_it_ended() -> None:
    seq, horizon = Sequencer(10, max_wait_s=5), Horizons(100, 110)
    assert release(seq, [12], horizon) == []
    horizon.value = (109, 115)  # a transaction older than 110 may still commit id 11
    assert release(seq, [12], horizon, now=1) == []
    horizon.value = (110, 115)  # none can: id 11 was rolled back
    assert release(seq, [12, 13], horizon, now=2) == [12, 13]
    assert seq.cursor == 13 and not seq.waiting


def test_a_gap_is_skipped_after_max_wait_whatever_the_horizon() -> None:
    seq, horizon = Sequencer(10, max_wait_s=5), Horizons(1, 110)
    assert release(seq, [12], horizon, now=100) == []
    assert release(seq, [12], horizon, now=104.9) == []
    assert release(seq, [12], horizon, now=105) == [12]


def test_each_gap_waits_on_its_own() -> None:
    seq, horizon = Sequencer(10, max_wait_s=5), Horizons(100, 110)
    assert release(seq, [12, 14], horizon) == []
    horizon.value = (110, 120)
    assert release(seq, [12, 14], horizon, now=1) == [12]  # the second gap opens at 120
    assert seq.waiting and seq.cursor == 12
    assert release(seq, [14], horizon, now=2) == []
    horizon.value = (120, 121)
    assert release(seq, [14], horizon, now=3) == [14]


def test_the_stream_knows_where_a_workflow_step_goes() -> None:
    assert status_after("waiting") == "waiting"
    assert status_after("unblocked") == "queued"
