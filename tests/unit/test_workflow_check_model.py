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


# --- when: the model's own reading of the contract -----------------------------------------

def when_snapshot(when: str, child_events: list[dict], parents: dict[str, list[dict]],
                  child_status: str = "succeeded") -> Snapshot:
    jobs = {p: {"status": "succeeded"} for p in parents}
    return Snapshot(jobs={**jobs, "c": {"status": child_status, "run_when": when}},
                    events={**parents, "c": child_events}, leases={}, execs={}, effects={},
                    dead_letters={})


OK = [ev("enqueued", 0), ev("claimed", 1), ev("succeeded", 2)]
DEAD = [ev("enqueued", 0), ev("claimed", 1), ev("dead_lettered", 2)]
RUNNING = [ev("enqueued", 0), ev("claimed", 1)]
REAPED = [ev("enqueued", 0), ev("claimed", 1),
          {**ev("recovered", 2), "detail": {"cause": "lease_expired", "status": "dead"}}]


def test_any_failed_released_after_a_parent_died_is_clean() -> None:
    snap = when_snapshot("any_failed", GOOD, {"p": DEAD, "q": RUNNING})
    assert step_violations("c", ["p", "q"], snap) == []
    reaped = when_snapshot("any_failed", GOOD, {"p": REAPED})
    assert step_violations("c", ["p"], reaped) == []


def test_any_failed_released_with_no_failed_parent_is_caught() -> None:
    snap = when_snapshot("any_failed", GOOD, {"p": OK, "q": RUNNING})
    assert any("any_failed" in v for v in step_violations("c", ["p", "q"], snap))


def test_always_released_before_every_parent_finished_is_caught() -> None:
    snap = when_snapshot("always", GOOD, {"p": DEAD, "q": RUNNING})
    assert any("before parent q finished" in v for v in step_violations("c", ["p", "q"], snap))
    assert step_violations("c", ["p", "q"], when_snapshot("always", GOOD,
                                                          {"p": DEAD, "q": OK})) == []


def test_condition_unmet_only_after_every_parent_succeeded() -> None:
    unmet = [ev("waiting", 0), {**ev("cancelled", 2.5), "detail": {"cause": "condition_unmet"}}]
    clean = when_snapshot("any_failed", unmet, {"p": OK}, child_status="cancelled")
    assert step_violations("c", ["p"], clean) == []
    early = when_snapshot("any_failed", unmet, {"p": OK, "q": RUNNING},
                          child_status="cancelled")
    assert any("condition_unmet" in v for v in step_violations("c", ["p", "q"], early))
    always = when_snapshot("always", unmet, {"p": OK}, child_status="cancelled")
    assert any("always step cancelled" in v for v in step_violations("c", ["p"], always))


def test_a_decided_when_step_left_waiting_is_caught() -> None:
    waiting = [ev("waiting", 0)]
    lost = when_snapshot("any_failed", waiting, {"p": DEAD}, child_status="waiting")
    assert any("lost release" in v for v in step_violations("c", ["p"], lost))
    unmet = when_snapshot("any_failed", waiting, {"p": OK}, child_status="waiting")
    assert any("lost condition_unmet" in v for v in step_violations("c", ["p"], unmet))
    fine = when_snapshot("always", waiting, {"p": DEAD, "q": RUNNING}, child_status="waiting")
    assert step_violations("c", ["p", "q"], fine) == []


def test_a_second_release_after_a_requeued_parent_succeeds_is_caught() -> None:
    requeued = [*DEAD, ev("requeued", 3), ev("claimed", 4), ev("succeeded", 5)]
    twice = [ev("waiting", 0), ev("unblocked", 2.5), ev("claimed", 2.6), ev("succeeded", 2.7),
             ev("unblocked", 5.5)]
    snap = when_snapshot("any_failed", twice, {"p": requeued})
    assert any("released 2 times" in v for v in step_violations("c", ["p"], snap))
