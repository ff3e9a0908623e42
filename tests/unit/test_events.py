"""The event-stream model: every history event maps to the state it leaves the job in."""

from __future__ import annotations

import json

import pytest

from taskline.events import STATUS_AFTER, Change, status_after
from taskline.jobs import Event, Status

PAYLOAD = {"id": 7, "job_id": "5d0c2f9e-8a9b-4c3e-9f51-0b6f3f1f2a10", "attempt": 2,
           "event": "retry_scheduled", "worker_id": "w-1", "created_at": "2026-01-02T03:04:05Z",
           "queue": "mail", "type": "send", "priority": 7, "to": None, "error": "Boom: x"}


def test_every_event_has_a_known_outcome() -> None:
    assert set(STATUS_AFTER) | {Event.RECOVERED} == set(Event)
    assert status_after("claimed") == "running"
    assert status_after("dead_lettered") == "dead"
    assert status_after("cancel_requested") is None  # still running until the worker stops


@pytest.mark.parametrize("recorded", [s.value for s in Status])
def test_recovered_takes_the_state_the_reaper_recorded(recorded: str) -> None:
    assert status_after("recovered", recorded) == recorded


def test_recovered_without_a_valid_state_moves_nowhere() -> None:
    assert status_after("recovered", None) is None
    assert status_after("recovered", "limbo") is None
    assert status_after("no_such_event") is None


def test_a_payload_becomes_a_change_and_back() -> None:
    change = Change.from_payload(json.dumps(PAYLOAD))
    assert change.status == "retrying" and change.error == "Boom: x" and change.id == 7
    data = json.loads(change.to_json())
    assert data["status"] == "retrying" and "to" not in data
    assert {k: v for k, v in data.items() if k != "status"} == {
        k: v for k, v in PAYLOAD.items() if k != "to"}


@pytest.mark.parametrize("text", ["", "[]", "{}", '{"id": "x", "job_id": 1}', "not json",
                                  json.dumps({**PAYLOAD, "attempt": None})])
def test_a_malformed_payload_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        Change.from_payload(text)
