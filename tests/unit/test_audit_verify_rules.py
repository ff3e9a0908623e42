"""The audit's pure rules (taskline.audit_verify) on hand-made rows: flow limit settings over
time, rate windows, and the lifecycle replayed by the product's transitions table."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from taskline.audit_verify import (
    Setting,
    flow_violations,
    sequence_problems,
    settings_over_time,
    terminal_problems,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def lease(job: str, start: float, end: float | None, key: str = "") -> dict:
    return {"job_id": job, "leased_at": at(start),
            "released_at": None if end is None else at(end), "limit_key": key}


def test_settings_follow_the_audit_trail_and_the_limit_in_force():
    changes = [
        {"at": at(0), "action": "limit.set", "target": "type:a",
         "detail": {"concurrency": 1, "rate": None, "per_key": False}},
        {"at": at(10), "action": "limit.set", "target": "type:a",
         "detail": {"concurrency": None, "rate": {"limit": 5, "period_s": 1.0}, "per_key": True}},
        {"at": at(20), "action": "limit.delete", "target": "type:a", "detail": {}},
    ]
    current = [{"scope": "type:a", "concurrency": 3, "rate_limit": None, "period_s": None,
                "per_key": False, "updated_at": at(30)},
               {"scope": "queue:q", "concurrency": 2, "rate_limit": None, "period_s": None,
                "per_key": False, "updated_at": at(5)}]
    settings = settings_over_time(changes, current)
    assert [(s.scope, s.concurrency, s.rate_limit, s.per_key, s.start, s.end)
            for s in settings] == [
        ("type:a", 1, None, False, at(0), at(10)),
        ("type:a", None, 5, True, at(10), at(20)),
        ("type:a", 3, None, False, at(30), None),
        ("queue:q", 2, None, False, at(5), None)]


def test_rate_counts_starts_in_a_sliding_window_while_in_force():
    setting = Setting("type:a", None, 2, 1.0, False, at(10), None)
    leases = [lease("before", 9.5, 9.6), lease("a", 10.0, 10.1), lease("b", 10.4, 10.5),
              lease("c", 10.9, 11.0), lease("d", 11.5, 11.6)]
    assert [v.job_id for v in flow_violations(setting, leases)] == ["c"]


def test_per_key_budgets_are_judged_apart():
    setting = Setting("type:a", 1, None, None, True, at(0), None)
    leases = [lease("a", 1, 5, "k1"), lease("b", 2, 6, "k2"), lease("c", 3, 4, "k1")]
    assert [v.job_id for v in flow_violations(setting, leases)] == ["c"]
    shared = Setting("type:a", 1, None, None, False, at(0), None)
    assert [v.job_id for v in flow_violations(shared, leases)] == ["b", "c"]


def test_a_lease_released_as_another_starts_is_not_counted():
    setting = Setting("type:a", 1, None, None, False, at(0), None)
    assert flow_violations(setting, [lease("a", 1, 2), lease("b", 2, 3)]) == []


def event(n: int, name: str, **detail) -> dict:
    return {"id": n, "event": name, "detail": detail or None}


def test_a_recovery_ends_where_its_row_says():
    events = [event(1, "enqueued"), event(2, "claimed"), event(3, "recovered", status="dead")]
    assert sequence_problems({"status": "dead"}, events) == []
    assert sequence_problems({"status": "queued"}, events) == [
        "history ends in state dead but the job is queued"]
    bad = [*events[:2], event(3, "recovered", status="succeeded")]
    assert "records state succeeded" in sequence_problems({"status": "dead"}, bad)[0]


def test_a_cancel_request_keeps_the_job_running():
    events = [event(1, "enqueued"), event(2, "claimed"), event(3, "cancel_requested"),
              event(4, "cancelled")]
    assert sequence_problems({"status": "cancelled"}, events) == []


def test_each_life_of_a_requeued_job_ends_once():
    leases = [{"id": 1, "attempt": 1, "released_at": at(1), "outcome": "failed"},
              {"id": 2, "attempt": 1, "released_at": at(2), "outcome": "succeeded"}]
    events = [event(1, "enqueued"), event(2, "claimed"), event(3, "dead_lettered"),
              event(4, "requeued"), event(5, "claimed"), event(6, "succeeded")]
    job = {"status": "succeeded", "attempts": 1}
    assert terminal_problems(job, events, leases) == []
    assert terminal_problems(job, events[:3] + events[4:], leases) == [
        "terminal events per life [2], expected [1]"]
