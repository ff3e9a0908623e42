"""The shared table the API's gunicorn processes balance connections by
(taskline_producer.http.balancer); the processes themselves are exercised in
tests/integration/test_api_balancing.py.
"""

from __future__ import annotations

import os

import pytest

from taskline_producer.http.balancer import STALE_S, ConnectionTable


def test_slots_are_claimed_once_and_freed_for_reuse() -> None:
    table = ConnectionTable(slots=3)
    claimed = [table.claim() for _ in range(3)]
    assert sorted(claimed) == [0, 1, 2]
    with pytest.raises(RuntimeError, match="more than 3"):
        table.claim()
    table.free(claimed[1])
    assert table.claim() == claimed[1]


def test_fewest_elsewhere_counts_only_live_siblings() -> None:
    table = ConnectionTable(slots=4)
    me, busy, idle, silent = (table.claim() for _ in range(4))
    now = 1000.0
    table.publish(me, 3, now)
    table.publish(busy, 5, now)
    table.publish(idle, 2, now - STALE_S / 2)
    table.publish(silent, 0, now - STALE_S - 0.1)  # stopped or hung: not waited for
    assert table.fewest_elsewhere(me, now) == 2
    table.free(idle)
    assert table.fewest_elsewhere(me, now) == 5
    assert table.fewest_elsewhere(busy, now) == 3


def test_a_claimed_slot_counts_only_once_it_beats() -> None:
    table = ConnectionTable(slots=2)
    me, starting = table.claim(), table.claim()
    table.publish(me, 4, 50.0)
    assert table.fewest_elsewhere(me, 50.0) is None  # forked, still loading the app
    table.publish(starting, 0, 50.0)
    assert table.fewest_elsewhere(me, 50.0) == 0


def test_a_forked_child_shares_the_table() -> None:
    table = ConnectionTable(slots=2)
    parent, child = table.claim(), table.claim()
    pid = os.fork()
    if pid == 0:  # the child publishes and leaves without running the parent's cleanup
        table.publish(child, 7, 10.0)
        os._exit(0)
    os.waitpid(pid, 0)
    assert table.fewest_elsewhere(parent, 10.0) == 7
