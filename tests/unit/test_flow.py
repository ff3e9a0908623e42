"""The flow-limit decisions (taskline.flow, pure): which held candidates start under every
limit that applies, most urgent first, skipping rather than waiting behind a spent budget; per-key
budgets; when a full rate budget frees; scope parsing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from taskline.flow import Candidate, Limit, Usage, admit, full_budgets, parse_scope

NOW = datetime(2026, 12, 1, tzinfo=UTC)
EMPTY = Usage({}, {}, {})


def job(n: int, type_: str = "mail", queue: str = "default", key: str | None = None):
    return Candidate(f"j{n}", type_, queue, key)


def test_a_job_takes_budget_from_its_type_and_queue_at_once():
    limits = {"type:mail": Limit("type:mail", concurrency=3),
              "queue:default": Limit("queue:default", concurrency=2)}
    result = admit([job(1), job(2), job(3, "sms")], limits, EMPTY, 10, NOW)
    assert result.picked == ["j1", "j2"]  # the queue's budget of 2 binds the sms job too
    assert ("queue:default", "") in result.full


def test_a_spent_budget_is_skipped_not_waited_behind():
    limits = {"type:mail": Limit("type:mail", concurrency=1)}
    usage = Usage({("type:mail", ""): 1}, {}, {})
    result = admit([job(1), job(2, "sms"), job(3)], limits, usage, 10, NOW)
    assert result.picked == ["j2"]


def test_per_key_budgets_and_the_shared_budget_of_jobs_without_a_key():
    limits = {"type:mail": Limit("type:mail", concurrency=1, per_key=True)}
    cands = [job(1, key="a"), job(2, key="a"), job(3, key="b"), job(4), job(5)]
    assert admit(cands, limits, EMPTY, 10, NOW).picked == ["j1", "j3", "j4"]


def test_slots_bound_the_admission():
    limits = {"type:mail": Limit("type:mail", concurrency=10)}
    assert admit([job(n) for n in range(5)], limits, EMPTY, 2, NOW).picked == ["j0", "j1"]


def test_a_full_rate_budget_frees_when_its_oldest_start_leaves_the_window():
    limits = {"type:mail": Limit("type:mail", rate_limit=2, period_s=10)}
    oldest = NOW - timedelta(seconds=4)
    usage = Usage({}, {("type:mail", ""): 1}, {("type:mail", ""): oldest})
    result = admit([job(1), job(2)], limits, usage, 10, NOW)
    assert result.picked == ["j1"]
    assert result.frees_at == oldest + timedelta(seconds=10)
    fresh = admit([job(1), job(2), job(3)], limits, EMPTY, 10, NOW)
    assert fresh.picked == ["j1", "j2"] and fresh.frees_at == NOW + timedelta(seconds=10)


def test_full_budgets_lists_only_budgets_without_room():
    limits = [Limit("type:a", concurrency=2), Limit("type:b", rate_limit=1, period_s=1)]
    assert full_budgets(limits, {("type:a", ""): 1}, {("type:b", ""): 1}) == [("type:b", "")]


@pytest.mark.parametrize(("scope", "ok"), [
    ("type:mail.send", True), ("type:a/b c", True), ("queue:reports-1", True),
    ("queue:bad name", False), ("tenant:x", False), ("type:", False), ("mail", False),
])
def test_scopes(scope, ok):
    if ok:
        assert parse_scope(scope)[0] in ("type", "queue")
    else:
        with pytest.raises(ValueError):
            parse_scope(scope)
