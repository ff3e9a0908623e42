"""Client.wait's pacing (pure): an answer the API held is followed by the next request at once;
one that came back at once (an API of a release before `wait_s`, during a rolling deploy) is
followed by a pause, so a waiting client never asks in a tight loop; the last request asks only
for what is left of the timeout."""

from __future__ import annotations

import time

from taskline.client import EARLY_PAUSE_S, MAX_WAIT_S, _pause, _wait_s


def test_an_answer_held_by_the_api_is_followed_at_once():
    assert _pause(time.monotonic() - 29.9, 30.0) == 0.0


def test_an_immediate_answer_is_followed_by_a_pause():
    assert _pause(time.monotonic(), 30.0) == EARLY_PAUSE_S


def test_wait_s_is_what_is_left_of_the_timeout_at_most_the_apis_bound():
    assert _wait_s(None) == MAX_WAIT_S
    assert _wait_s(time.monotonic() + 120) == MAX_WAIT_S
    assert 0 < _wait_s(time.monotonic() + 2) <= 2
    assert _wait_s(time.monotonic() - 1) == 0.0
