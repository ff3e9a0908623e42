"""The fault checker's schedule model: each (schedule, slot instant) has at most one job."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.faults.checker import slot_violations

T0 = datetime(2026, 1, 1, 12, tzinfo=UTC)


def job(job_id: str, at: datetime, name: str = "tick") -> dict:
    return {"id": job_id, "schedule": name, "scheduled_for": at}


def slot(job_id: str, at: datetime, name: str = "tick") -> dict:
    return {"schedule": name, "slot": at, "job_id": job_id}


def fired(at: datetime, name: str = "tick") -> dict:
    return {"action": "schedule_fired", "schedule": name, "scheduled_for": at.isoformat()}


def test_one_job_per_slot_with_its_record_passes():
    t1 = T0 + timedelta(seconds=2)
    assert slot_violations([job("a", T0), job("b", t1)], [slot("a", T0), slot("b", t1)],
                           [fired(T0), fired(t1)]) == []


def test_a_slot_whose_job_was_deleted_by_retention_passes():
    assert slot_violations([], [slot("a", T0)], [fired(T0)]) == []


def test_two_jobs_for_one_slot_are_caught_whatever_the_record_says():
    problems = slot_violations([job("a", T0), job("b", T0.astimezone())], [slot("a", T0)], [])
    assert any("2 jobs" in p for p in problems)
    assert any("job b is not the slot's recorded job (a)" in p for p in problems)


def test_a_job_without_its_slots_record_is_caught():
    (problem,) = slot_violations([job("a", T0)], [], [])
    assert "job a is not the slot's recorded job (None)" in problem


def test_two_instances_claiming_one_slot_are_caught():
    problems = slot_violations([job("a", T0)], [slot("a", T0)], [fired(T0), fired(T0)])
    assert problems == ["schedule tick slot 2026-01-01T12:00:00: 2 instances logged firing it"]
    (never,) = slot_violations([], [], [fired(T0)])
    assert "logged fired but never recorded" in never


def test_slots_of_different_schedules_are_apart():
    assert slot_violations([job("a", T0), job("b", T0, "other")],
                           [slot("a", T0), slot("b", T0, "other")], []) == []
