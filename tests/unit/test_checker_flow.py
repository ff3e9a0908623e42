"""The fault checker's flow-limit judges: the most leases open at one instant, and the busiest
sliding window of starts, on hand-made lease histories (including the edges a judge gets wrong:
a lease ending as another starts, a lease never released, starts exactly one period apart)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.faults.checker import busiest_window, peak_open

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def lease(start: float, end: float | None) -> dict:
    return {"leased_at": at(start), "released_at": None if end is None else at(end)}


def test_peak_counts_overlaps_and_never_released_leases():
    assert peak_open([]) == 0
    assert peak_open([lease(0, 2), lease(1, 3), lease(1.5, None)]) == 3
    assert peak_open([lease(0, 1), lease(1, 2), lease(2, 3)]) == 1  # back to back: one at a time
    assert peak_open([lease(0, None), lease(5, None)]) == 2


def test_busiest_window_is_sliding_not_bucketed():
    # Two fixed 1 s buckets would each hold 2; the sliding window (0.6, 1.6] holds 4.
    assert busiest_window([at(x) for x in (0.1, 0.7, 0.9, 1.1, 1.5, 2.4)], 1.0) == 4
    assert busiest_window([at(0), at(1), at(2)], 1.0) == 1  # exactly a period apart
    assert busiest_window([], 1.0) == 0
