"""Progress values and their pace (taskline.progress), pure: what a value may be (a number in
0..1 or a JSON object of at most 4 KiB), and that a job's values are written at most once a
second, a value held meanwhile replaced by later ones and written by `flush`."""

from __future__ import annotations

import pytest

from taskline import progress


def test_numbers_in_0_to_1_and_small_objects_pass():
    assert progress.validate(0) == 0.0 and progress.validate(1) == 1.0
    assert progress.validate(0.25) == 0.25
    assert progress.validate({"rows": 10, "of": 100}) == {"rows": 10, "of": 100}


@pytest.mark.parametrize("bad, error", [
    (1.5, ValueError), (-0.1, ValueError), (float("nan"), ValueError), (True, TypeError),
    ("half", TypeError), ([0.5], TypeError), ({"x": "y" * 4100}, ValueError),
    ({"x": object()}, ValueError), ({"x": float("inf")}, ValueError),
])
def test_anything_else_is_refused(bad, error):
    with pytest.raises(error):
        progress.validate(bad)


def test_values_are_written_at_most_once_a_second_and_the_last_one_is_flushed():
    now = [100.0]
    written: list = []
    reporter = progress.Reporter(lambda v: written.append(v) or True, clock=lambda: now[0])
    reporter.report(0.1)
    reporter.report(0.2)
    reporter.report(0.3)
    assert written == [0.1]
    now[0] += 1.0
    reporter.report(0.4)
    assert written == [0.1, 0.4]
    reporter.report(0.5)
    reporter.flush()
    reporter.flush()  # nothing held any more
    assert written == [0.1, 0.4, 0.5]
