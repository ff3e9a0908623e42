"""The fault checker's own lifecycle model: it judges histories, and agrees with the product's
table without being derived from it (a disagreement means one of the two is wrong)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from taskline import transitions
from tests.faults.checker import LEGAL, Snapshot, retention_violations, transition_violations


def history(*events: str | tuple[str, str]) -> list[dict]:
    rows = []
    for n, item in enumerate(events, start=1):
        name, status = item if isinstance(item, tuple) else (item, None)
        rows.append({"id": n, "event": name, "detail": {"status": status} if status else None})
    return rows


def test_a_legal_history_ending_in_the_current_state_passes():
    events = history("enqueued", "claimed", ("recovered", "queued"), "claimed",
                     "retry_scheduled", "promoted", "claimed", "cancel_requested", "succeeded")
    assert transition_violations({"status": "succeeded"}, events) == []
    dead_then_requeued = history("scheduled", "promoted", "claimed", ("recovered", "dead"),
                                 "requeued", "claimed", "released")
    assert transition_violations({"status": "queued"}, dead_then_requeued) == []


def test_an_illegal_move_is_caught():
    (problem,) = transition_violations({"status": "succeeded"},
                                       history("enqueued", "succeeded"))
    assert "illegal transition: succeeded" in problem and "queued" in problem
    (twice,) = transition_violations({"status": "succeeded"}, history(
        "enqueued", "claimed", "succeeded", "succeeded"))
    assert "illegal" in twice


def test_a_history_that_ends_elsewhere_than_the_row_is_caught():
    (problem,) = transition_violations({"status": "dead"}, history("enqueued", "claimed"))
    assert "ends in state running but the job is dead" in problem
    (recorded,) = transition_violations({"status": "queued"}, history(
        "enqueued", "claimed", ("recovered", "limbo")))
    assert "records state limbo" in recorded


def test_the_checker_and_the_product_agree_on_every_move():
    product = {(None if s is None else s.value, e.value): {t.value for t in targets}
               for (s, e), targets in transitions.TABLE.items()}
    assert product == {key: set(targets) for key, targets in LEGAL.items()}


def snapshot(jobs=(), events=(), leases=(), dead=(), expired=()) -> Snapshot:
    return Snapshot(jobs={j: {"id": j, "status": "succeeded"} for j in jobs},
                    events={j: [{}] for j in events}, leases={j: [{}] for j in leases},
                    execs={}, effects={}, dead_letters={j: {} for j in dead},
                    expired={j: dict(r) for j, r in expired})


def deletion(status: str, kept_s: float) -> dict:
    finished = datetime(2026, 1, 1, tzinfo=UTC)
    deleted = finished + timedelta(seconds=kept_s)
    return {"action": "expired", "status": status, "finished_at": finished.isoformat(),
            "ts": deleted.strftime("%Y-%m-%dT%H:%M:%S.000Z")}


RETAIN = {"succeeded": 60.0, "cancelled": 60.0, "dead": 0.0}


def test_a_finished_job_deleted_whole_after_its_retention_passes():
    snap = snapshot(jobs=["kept"], events=["kept"], expired=[("gone", deletion("succeeded", 61))])
    assert retention_violations(snap, RETAIN) == []


def test_deleting_an_unfinished_or_too_young_or_kept_job_is_caught():
    snap = snapshot(expired=[("a", deletion("running", 600)), ("b", deletion("cancelled", 5)),
                             ("c", deletion("dead", 86400))])
    problems = retention_violations(snap, RETAIN)
    assert any("job a was deleted while running" in p for p in problems)
    assert any("job b (cancelled) was deleted 5.0 s after it finished" in p for p in problems)
    assert any("job c (dead) was deleted although its status is kept forever" in p
               for p in problems)


def test_a_half_deleted_job_is_caught_whatever_the_logs_say():
    """A recorded deletion's events wait for their partition (migration 0021); history of a
    job nobody recorded deleting, or a DLQ row of an absent job, is half a job."""
    snap = snapshot(events=["e", "x"], leases=["l"], dead=["d"],
                    expired=[("e", deletion("succeeded", 61))])
    problems = retention_violations(snap, RETAIN)
    assert problems == ["retention: job d is gone but left a DLQ row",
                        "retention: job x is gone without a recorded deletion but left events",
                        "retention: job l is gone without a recorded deletion but left leases"]


def test_expiry_is_legal_from_every_finished_state_only():
    assert {key for key, targets in LEGAL.items() if "deleted" in targets} == {
        ("succeeded", "expired"), ("cancelled", "expired"), ("dead", "expired"),
        ("dead", "purged")}


def test_only_a_dead_job_can_be_purged():
    assert {key[0] for key in LEGAL if key[1] == "purged"} == {"dead"}
