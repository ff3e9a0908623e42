"""The audit's ordering-key rule (taskline.audit_verify.ordering_overlaps) on hand-made leases:
a key's leases one after another pass, touching ends pass, a lease begun while an earlier one
(of any job of the key, even one that began long before) was still held is reported, and an
open lease holds every later one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from taskline.audit_verify import ordering_overlaps

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def lease(n: int, job: str, start: float, end: float | None) -> dict:
    return {"id": n, "job_id": job, "leased_at": T0 + timedelta(seconds=start),
            "released_at": None if end is None else T0 + timedelta(seconds=end)}


def test_leases_one_after_another_and_touching_ends_pass():
    assert ordering_overlaps([lease(2, "b", 1, 2), lease(1, "a", 0, 1), lease(3, "a", 5, 6)]) == []


def test_a_lease_inside_a_long_earlier_one_is_reported_even_after_a_short_one():
    found = ordering_overlaps([lease(1, "a", 0, 10), lease(2, "b", 1, 2), lease(3, "c", 3, 4)])
    assert [(v.rule, v.job_id) for v in found] == [("ordering_overlap", "b"),
                                                   ("ordering_overlap", "c")]
    assert "job a" in found[1].message


def test_an_open_lease_holds_every_later_one():
    found = ordering_overlaps([lease(1, "a", 0, None), lease(2, "b", 50, 51)])
    assert [v.job_id for v in found] == ["b"]
