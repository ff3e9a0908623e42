"""The pure job model: priorities, ids, backoff and building jobs from rows (retry decisions:
test_transitions.py)."""

from __future__ import annotations

import random
import time
import uuid
from collections import namedtuple
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from taskline.jobs import (
    PENDING,
    TERMINAL,
    Backoff,
    Job,
    Status,
    new_job_id,
    parse_job_id,
    parse_priority,
    scoped_key,
)


@pytest.mark.parametrize(("value", "expected"), [
    (0, 0), (9, 9), (5, 5), ("low", 2), ("normal", 5), ("HIGH", 7), ("critical", 9),
])
def test_parse_priority_accepts_levels_and_names(value, expected):
    assert parse_priority(value) == expected


@pytest.mark.parametrize("value", [-1, 10, True, False, 5.0, "5", "urgent", None, [5]])
def test_parse_priority_rejects_everything_else(value):
    with pytest.raises(ValueError, match="priority"):
        parse_priority(value)


def test_parse_job_id():
    assert parse_job_id("not-a-uuid") is None
    assert parse_job_id("../../etc") is None
    assert str(parse_job_id("0f8fad5b-d9cb-469f-a165-70867728950e")) == (
        "0f8fad5b-d9cb-469f-a165-70867728950e")


def test_new_job_ids_are_uuid7_ordered_by_creation_time():
    before_ms = time.time_ns() // 1_000_000
    first = new_job_id()
    time.sleep(0.002)  # the next millisecond at least: order within one ms is not promised
    second = new_job_id()
    after_ms = time.time_ns() // 1_000_000
    assert isinstance(first, uuid.UUID)
    assert (first.version, first.variant) == (7, uuid.RFC_4122)
    assert first < second  # as bytes, so as PostgreSQL's uuid order too
    assert before_ms <= first.int >> 80 <= second.int >> 80 <= after_ms
    assert len({new_job_id() for _ in range(10_000)}) == 10_000


def test_states_partition():
    assert Status.SUCCEEDED.terminal and Status.DEAD.terminal and Status.CANCELLED.terminal
    assert not Status.RUNNING.terminal and not Status.RUNNING.pending
    assert PENDING.isdisjoint(TERMINAL)


def test_backoff_follows_the_documented_schedule_within_jitter():
    backoff = Backoff(base_s=10, factor=4, max_s=3600)
    rng = random.Random(7)
    for attempt, nominal in [(1, 10), (2, 40), (3, 160), (4, 640), (5, 2560), (6, 3600)]:
        delays = [backoff.delay(attempt, rng) for _ in range(200)]
        assert nominal / 2 <= min(delays) and max(delays) <= nominal
        assert max(delays) - min(delays) > nominal / 4, "jitter spreads the retries"


def test_backoff_caps_huge_exponents():
    assert Backoff(10, 4, 60).delay(10_000, random.Random(1)) <= 60


def test_every_state_has_one_redis_home_and_the_state_sets_follow_from_it():
    from taskline.jobs import DELAYED, PENDING, REDIS_HOME, TERMINAL, RedisHome, Status
    from taskline.store.schema import PENDING_SQL, TERMINAL_SQL

    assert set(REDIS_HOME) == set(Status)
    assert {Status.QUEUED, Status.SCHEDULED, Status.RETRYING} == PENDING
    assert {Status.SCHEDULED, Status.RETRYING} == DELAYED
    assert {s for s in Status if REDIS_HOME[s] is RedisHome.NONE} - TERMINAL == {Status.WAITING}

    def quoted(text: str) -> set[str]:
        return {part.strip(" ()'") for part in text.split("IN", 1)[-1].split(",")}

    assert quoted(PENDING_SQL) == {s.value for s in PENDING}
    assert quoted(TERMINAL_SQL) == {s.value for s in TERMINAL}


NOW = datetime(2026, 12, 3, 16, 0, tzinfo=UTC)
REQUIRED = {"id": uuid.UUID(int=7), "type": "t", "queue": "q", "payload": {"a": 1},
            "priority": 5, "status": Status.QUEUED, "attempts": 0, "max_retries": 3,
            "timeout_s": 30.0, "next_run_at": None, "idempotency_key": None,
            "last_error": None, "result": None, "created_at": NOW, "updated_at": NOW,
            "cancel_requested": False}


def test_of_builds_the_job_init_builds_with_unnamed_fields_at_their_defaults():
    fields = {**REQUIRED, "tags": ("a", "b"), "ordering_key": "k"}
    built = Job.of(fields)
    assert built == Job(**fields)
    assert (built.snoozes, built.workflow_id, built.coalesced) == (0, None, None)
    assert built.to_dict() == Job(**fields).to_dict()


def test_to_dict_shows_the_fields_a_plain_job_leaves_unset_once_set():
    later = NOW + timedelta(hours=1)
    job = Job.of({**REQUIRED, "idempotency_key": scoped_key("k", "token:a"), "tags": ("x",),
                  "expires_at": later, "schedule": "s", "scheduled_for": NOW})
    shown = job.to_dict()
    assert (shown["idempotency_key"], shown["tags"], shown["expires_at"],
            shown["scheduled_for"]) == ("k", ["x"], later.isoformat(), NOW.isoformat())
    plain = Job.of({**REQUIRED, "tags": ()}).to_dict()
    assert (plain["idempotency_key"], plain["tags"], plain["expires_at"],
            plain["scheduled_for"]) == (None, [], None, None)


def test_from_row_picks_the_job_columns_and_converts_them():
    # A claim's row: job columns as the driver returns them, a lease's beside them.
    names = (*REQUIRED, "tags", "snoozes", "lease_id", "leased_until")
    row = namedtuple("Row", names)(**{**REQUIRED, "status": "running",
                                      "timeout_s": Decimal("2.5")},
                                   tags=["x"], snoozes=None, lease_id=9, leased_until=NOW)
    job = Job.from_row(row)
    assert job == Job(**{**REQUIRED, "status": Status.RUNNING, "timeout_s": 2.5,
                         "tags": ("x",)})
    assert type(job.timeout_s) is float and job.status is Status.RUNNING
    assert not hasattr(job, "lease_id")


def test_from_row_names_a_missing_required_column():
    names = tuple(n for n in REQUIRED if n != "attempts")
    row = namedtuple("Row", names)(**{n: REQUIRED[n] for n in names})
    with pytest.raises(ValueError, match="attempts"):
        Job.from_row(row)
