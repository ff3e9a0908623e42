"""The collector settings of long-running processes: start-up objects frozen, thresholds kept,
reference cycles still reclaimed."""

from __future__ import annotations

import gc
import weakref

import pytest

from taskline import heap


@pytest.fixture
def restored_gc():
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def test_settle_freezes_start_up_objects_and_keeps_the_thresholds(restored_gc):
    threshold = gc.get_threshold()
    heap.settle_after_start()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == threshold


def test_cycles_made_after_settling_are_still_collected(restored_gc):
    heap.settle_after_start()
    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    gc.collect()
    assert gone() is None
