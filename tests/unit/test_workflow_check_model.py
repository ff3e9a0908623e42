"""The fault checker's workflow model catches what it exists to catch: a step released twice,
released before a parent succeeded, run before its release, or left waiting after all its
parents succeeded."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.faults.checker import Snapshot
from tests.faults.workflowcheck import step_violations

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def ev(name: str, s: float) -> dict:
    return {"event": name, "created_at": at(s), "id": int(s * 1000), "detail": None}


def snapshot(child_events: list[dict], child_status: str = "succeeded",
             parent_events: list[dict] | None = None, parent_status: str = "succeeded",
             execs: list[float] = ()) -> Snapshot:
    parent = parent_events if parent_events is not None else [
        ev("enqueued", 0), ev("claimed", 1), ev("succeeded", 2)]
    return Snapshot(jobs={"p": {"status": parent_status}, "c": {"status": child_status}},
                    events={"p": parent, "c": child_events}, leases={},
                    execs={"c": [{"started_at": at(s)} for s in execs]}, effects={},
                    dead_letters={})


GOOD = [ev("waiting", 0), ev("unblocked", 2.5), ev("claimed", 3), ev("succeeded", 4)]


def test_a_step_released_once_after_its_parent_and_run_after_is_clean() -> None:
    assert step_violations("c", ["p"], snapshot(GOOD, execs=[3.1])) == []


def test_a_double_release_is_caught() -> None:
    events = [*GOOD[:2], ev("unblocked", 2.6), *GOOD[2:]]
    assert any("released 2 times" in v for v in step_violations("c", ["p"], snapshot(events)))


def test_a_release_before_the_parent_succeeded_is_caught() -> None:
    events = [ev("waiting", 0), ev("unblocked", 1.5), ev("claimed", 3), ev("succeeded", 4)]
    assert any("before parent p" in v for v in step_violations("c", ["p"], snapshot(events)))


def test_a_success_written_by_the_releasing_transaction_counts_whatever_its_time() -> None:
    parent = [ev("enqueued", 0), ev("claimed", 1), ev("succeeded", 2.6)]
    events = [ev("waiting", 0), ev("unblocked", 2.5), ev("claimed", 3), ev("succeeded", 4)]
    snap = snapshot(events, parent_events=parent)
    same = {parent[2]["id"]: "700", events[1]["id"]: "700"}
    assert step_violations("c", ["p"], snap, same) == []
    other = {parent[2]["id"]: "701", events[1]["id"]: "700"}
    assert any("before parent p" in v for v in step_violations("c", ["p"], snap, other))


def test_a_run_before_the_release_or_without_one_is_caught() -> None:
    early = step_violations("c", ["p"], snapshot(GOOD, execs=[2.0]))
    assert any("before its release" in v for v in early)
    unreleased = [ev("waiting", 0), ev("claimed", 3)]
    assert any("without a release" in v
               for v in step_violations("c", ["p"], snapshot(unreleased, "running")))


def test_a_lost_release_is_caught_and_a_dead_parent_keeps_its_step_waiting() -> None:
    lost = step_violations("c", ["p"], snapshot([ev("waiting", 0)], "waiting"))
    assert any("lost release" in v for v in lost)
    dead = [ev("enqueued", 0), ev("claimed", 1), ev("dead_lettered", 2)]
    assert step_violations("c", ["p"], snapshot([ev("waiting", 0)], "waiting", dead,
                                                "dead")) == []
