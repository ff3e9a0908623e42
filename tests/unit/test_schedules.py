"""Cron slots in time zones: daylight-saving edges as cron reads them, catch-up, validation.

The clock is injected: every instant below is a value, nothing sleeps or reads the time.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from taskline.schedules import (
    MAX_SLOTS_PER_PASS,
    MISSED_AFTER_S,
    Cron,
    InvalidSchedule,
    declared,
    due_slots,
    missed,
    valid_name,
)
from taskline.settings import Settings


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def local(cron: Cron, slots: list[datetime]) -> list[str]:
    return [s.astimezone(cron.zone).isoformat() for s in slots]


def due_slot(cron: Cron, since: datetime, now: datetime, catch_up: str) -> datetime | None:
    """The newest slot a leader beginning at `now` fires (every slot before it was missed)."""
    due = due_slots(cron, since, now, now, catch_up)
    return due.slots[-1] if due.slots else None


def test_a_daily_slot_in_new_yorks_skipped_hour_fires_right_after_the_gap():
    cron = Cron.parse("30 2 * * *", "America/New_York")
    # 2026-03-08: 02:00 EST jumps to 03:00 EDT; 02:30 does not exist that day.
    assert local(cron, cron.next_runs(utc(2026, 3, 7, 12), 3)) == [
        "2026-03-08T03:00:00-04:00", "2026-03-09T02:30:00-04:00", "2026-03-10T02:30:00-04:00"]


def test_slots_inside_berlins_gap_fold_into_one_instant_after_it():
    cron = Cron.parse("*/15 * * * *", "Europe/Berlin")
    # 2026-03-29: 02:00 CET jumps to 03:00 CEST; 02:00..02:45 and 03:00 are one instant.
    assert local(cron, cron.next_runs(utc(2026, 3, 29, 0, 40), 4)) == [
        "2026-03-29T01:45:00+01:00", "2026-03-29T03:00:00+02:00",
        "2026-03-29T03:15:00+02:00", "2026-03-29T03:30:00+02:00"]


def test_a_slot_in_new_yorks_repeated_hour_fires_once_at_its_first_occurrence():
    cron = Cron.parse("30 1 * * *", "America/New_York")
    # 2026-11-01: 02:00 EDT falls back to 01:00 EST; 01:30 happens twice.
    assert local(cron, cron.next_runs(utc(2026, 10, 31, 12), 2)) == [
        "2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00"]


def test_half_hourly_slots_in_berlins_repeated_hour_are_not_repeated():
    cron = Cron.parse("*/30 * * * *", "Europe/Berlin")
    # 2026-10-25: 03:00 CEST falls back to 02:00 CET.
    assert local(cron, cron.next_runs(utc(2026, 10, 24, 23, 45), 5)) == [
        "2026-10-25T02:00:00+02:00", "2026-10-25T02:30:00+02:00",
        "2026-10-25T03:00:00+01:00", "2026-10-25T03:30:00+01:00",
        "2026-10-25T04:00:00+01:00"]


def test_the_latest_slot_inside_a_repeated_hour_is_its_first_occurrence():
    cron = Cron.parse("*/30 * * * *", "America/New_York")
    # 01:10 EST (06:10 UTC) is in the second 01:00-02:00; its slots fired in the first.
    assert local(cron, [cron.latest(utc(2026, 11, 1, 6, 10))]) == ["2026-11-01T01:30:00-04:00"]
    assert due_slot(cron, utc(2026, 11, 1, 5, 30), utc(2026, 11, 1, 6, 10), "latest") is None


def test_the_latest_slot_includes_one_exactly_now():
    cron = Cron.parse("0 12 * * *")
    assert cron.latest(utc(2026, 1, 1, 12)) == utc(2026, 1, 1, 12)
    assert cron.latest(utc(2026, 1, 1, 11, 59, 59)) == utc(2025, 12, 31, 12)


def test_a_sixth_field_counts_seconds():
    cron = Cron.parse("* * * * * */5")
    assert cron.next_runs(utc(2026, 1, 1, 0, 0, 1), 3) == [
        utc(2026, 1, 1, 0, 0, 5), utc(2026, 1, 1, 0, 0, 10), utc(2026, 1, 1, 0, 0, 15)]


def test_slots_before_since_never_fire():
    cron = Cron.parse("*/5 * * * *")
    created = utc(2026, 1, 1, 12, 7)
    assert due_slot(cron, created, utc(2026, 1, 1, 12, 9), "latest") is None
    assert due_slot(cron, created, utc(2026, 1, 1, 12, 10, 0, 400000), "latest") == utc(
        2026, 1, 1, 12, 10)


def test_catch_up_latest_fires_the_newest_missed_slot_once():
    cron = Cron.parse("*/5 * * * *")
    last = utc(2026, 1, 1, 12, 0)
    now = utc(2026, 1, 1, 13, 2)  # down for an hour: 12 slots missed
    slot = due_slot(cron, last, now, "latest")
    assert slot == utc(2026, 1, 1, 13, 0)
    assert missed(cron, last, slot) == 11
    assert due_slot(cron, slot, now, "latest") is None


def test_catch_up_none_skips_a_slot_found_too_late():
    cron = Cron.parse("*/5 * * * *")
    last = utc(2026, 1, 1, 12, 0)
    late = utc(2026, 1, 1, 13, 0) + timedelta(seconds=MISSED_AFTER_S + 1)
    assert due_slot(cron, last, late, "none") is None
    on_time = utc(2026, 1, 1, 13, 0, 1)
    assert due_slot(cron, last, on_time, "none") == utc(2026, 1, 1, 13, 0)


def test_every_slot_since_the_leadership_began_is_due_oldest_first():
    cron = Cron.parse("* * * * * *")  # every second
    began = utc(2026, 1, 1, 12, 0, 0)
    due = due_slots(cron, began, began + timedelta(seconds=10), began, "none")
    assert due.slots == [began + timedelta(seconds=i) for i in range(1, 11)]
    assert due.skipped == 0


def test_catch_up_decides_only_about_slots_before_the_leadership_began():
    cron = Cron.parse("* * * * *")  # every minute
    last, began = utc(2026, 1, 1, 11, 0), utc(2026, 1, 1, 12, 0, 30)
    now = began + timedelta(minutes=2)
    latest = due_slots(cron, last, now, began, "latest")
    assert latest.slots == [utc(2026, 1, 1, 12, 0), utc(2026, 1, 1, 12, 1),
                            utc(2026, 1, 1, 12, 2)]
    assert latest.skipped == 59
    none = due_slots(cron, last, now, began, "none")
    assert none.slots == [utc(2026, 1, 1, 12, 1), utc(2026, 1, 1, 12, 2)]
    assert none.skipped == 60


def test_a_pass_fires_at_most_its_limit_and_the_rest_next():
    cron = Cron.parse("* * * * * *")
    began = utc(2026, 1, 1, 12)
    now = began + timedelta(seconds=MAX_SLOTS_PER_PASS + 500)
    first = due_slots(cron, began, now, began, "none")
    assert len(first.slots) == MAX_SLOTS_PER_PASS
    rest = due_slots(cron, first.slots[-1], now, began, "none")
    assert rest.slots[0] == first.slots[-1] + timedelta(seconds=1) and len(rest.slots) == 500


@pytest.mark.parametrize("expression", ["", "* * * *", "* * * * * * *", "61 * * * *",
                                        "*/0 * * * *", "a b c d e", "@hourly", "0 0 31 2 *",
                                        "* * * * \x00", 5, None])
def test_invalid_cron_expressions_are_refused(expression):
    with pytest.raises(InvalidSchedule):
        Cron.parse(expression)


@pytest.mark.parametrize("zone", ["Mars/Olympus", "", "../etc/passwd", "Europe//Berlin",
                                  "x" * 100, 3])
def test_unknown_time_zones_are_refused(zone):
    with pytest.raises(InvalidSchedule):
        Cron.parse("* * * * *", zone)


def test_names_follow_the_name_rule():
    assert valid_name("nightly.report:eu-1_a")
    assert not valid_name("") and not valid_name("a/b") and not valid_name("x" * 201)
    assert not valid_name("caf\u00e9") and not valid_name(None)


def test_code_declarations_get_the_api_defaults_and_are_checked():
    spec = {"cron": "0 3 * * *", "timezone": "UTC", "catch_up": "latest", "paused": False,
            "job": {"type": "report"}}
    settings = Settings.from_env(env={}, default_max_retries=3, default_timeout_s=300.0)
    fields = declared("nightly", spec, settings)
    assert fields["job"] == {"type": "report", "payload": {}, "queue": "default",
                             "priority": 5, "max_retries": 3, "timeout_s": 300.0}
    keyed = declared("nightly", {**spec, "job": {"type": "report", "limit_key": "t1"}}, settings)
    assert keyed["job"]["limit_key"] == "t1"
    for bad in ({"type": "report", "delay_s": 5}, {"type": "report", "queue": "a b"}, {},
                {"type": "report", "limit_key": ""}):
        with pytest.raises(InvalidSchedule):
            declared("nightly", {**spec, "job": bad}, settings)
    with pytest.raises(InvalidSchedule):
        declared("no/slash", spec, settings)
