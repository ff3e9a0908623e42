"""GroupWriter: requests that arrive while a write is in flight are written together next, each
gets its own result, and an error fails only the requests it concerns."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from taskline_producer.operations.grouping import GroupWriter
from tests.helpers import wait_for


class HeldWrites:
    """A write function that records its calls and holds the first one until released."""

    def __init__(self, fail: Callable[[Sequence[str]], Exception | None] = lambda items: None):
        self.calls: list[list[str]] = []
        self.first_started = threading.Event()
        self.release = threading.Event()
        self._fail = fail

    def __call__(self, items: Sequence[str]) -> list[str]:
        self.calls.append(list(items))
        if len(self.calls) == 1:
            self.first_started.set()
            assert self.release.wait(10)
        error = self._fail(items)
        if error is not None:
            raise error
        return [f"done:{item}" for item in items]


def _submit_all(writer: GroupWriter[str, str], items: list[str],
                outcomes: dict[str, object]) -> list[threading.Thread]:
    def run(item: str) -> None:
        try:
            outcomes[item] = writer.submit(item)
        except BaseException as err:  # the interrupt test's too
            outcomes[item] = err
    threads = [threading.Thread(target=run, args=(item,)) for item in items]
    for thread in threads:
        thread.start()
    return threads


def _hold_first_then_queue(writer: GroupWriter[str, str], writes: HeldWrites,
                           followers: list[str],
                           outcomes: dict[str, object]) -> list[threading.Thread]:
    """'first' is being written (held) while every follower waits for the next write."""
    threads = _submit_all(writer, ["first"], outcomes)
    assert writes.first_started.wait(10)
    threads += _submit_all(writer, followers, outcomes)
    wait_for(lambda: writer.waiting == len(followers), interval=0.001,
             message="every follower waiting")
    return threads


def _finish(writes: HeldWrites, threads: list[threading.Thread]) -> None:
    writes.release.set()
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive()


def test_a_lone_request_is_written_at_once_by_itself() -> None:
    sizes: list[int] = []
    writer = GroupWriter(lambda items: [f"done:{i}" for i in items], sizes=sizes.append)
    assert writer.submit("a") == "done:a"
    assert writer.submit("b") == "done:b"
    assert sizes == [1, 1]
    assert writer.waiting == 0


def test_requests_arriving_during_a_write_share_the_next_one() -> None:
    writes = HeldWrites()
    sizes: list[int] = []
    writer = GroupWriter(writes, sizes=sizes.append)
    outcomes: dict[str, object] = {}
    followers = [f"f{i}" for i in range(6)]
    threads = _hold_first_then_queue(writer, writes, followers, outcomes)
    _finish(writes, threads)

    assert writes.calls[0] == ["first"]
    assert len(writes.calls) == 2 and sorted(writes.calls[1]) == followers
    assert sizes == [1, 6]
    assert outcomes == {item: f"done:{item}" for item in ["first", *followers]}
    assert writer.submit("later") == "done:later"  # the lead was given back


def test_an_item_error_fails_only_its_own_request() -> None:
    def fail(items: Sequence[str]) -> Exception | None:
        return ValueError("refused") if "bad" in items else None
    writes = HeldWrites(fail)
    writer = GroupWriter(writes, item_errors=(ValueError,))
    outcomes: dict[str, object] = {}
    threads = _hold_first_then_queue(writer, writes, ["ok1", "bad", "ok2"], outcomes)
    _finish(writes, threads)

    assert sorted(writes.calls[1]) == ["bad", "ok1", "ok2"]  # the group, refused
    assert sorted(map(tuple, writes.calls[2:])) == [("bad",), ("ok1",), ("ok2",)]  # then alone
    assert outcomes["ok1"] == "done:ok1" and outcomes["ok2"] == "done:ok2"
    assert isinstance(outcomes["bad"], ValueError)


def test_any_other_error_fails_the_whole_group_once() -> None:
    writes = HeldWrites(lambda items: ConnectionError("down") if len(items) > 1 else None)
    writer = GroupWriter(writes, item_errors=(ValueError,))
    outcomes: dict[str, object] = {}
    threads = _hold_first_then_queue(writer, writes, ["a", "b", "c"], outcomes)
    _finish(writes, threads)

    assert len(writes.calls) == 2  # not retried item by item
    assert outcomes["first"] == "done:first"
    assert all(isinstance(outcomes[item], ConnectionError) for item in "abc")
    assert writer.submit("after") == "done:after"


class Interrupt(BaseException):
    """Not an Exception: what a leading thread may be stopped by (KeyboardInterrupt, say)."""


def test_an_interrupted_leader_leaves_no_request_with_a_missing_result() -> None:
    def fail(items: Sequence[str]) -> Exception | None:
        if len(items) > 1:
            raise Interrupt
        return None
    writes = HeldWrites(fail)
    writer = GroupWriter(writes)
    outcomes: dict[str, object] = {}
    threads = _hold_first_then_queue(writer, writes, ["a", "b", "c"], outcomes)
    writes.release.set()
    for thread in threads:
        thread.join(10)

    # The leader of the second write got the interrupt; the others of its group were told
    # their write failed, none was handed a result it never had.
    assert outcomes["first"] == "done:first"
    kinds = sorted(type(outcomes[item]).__name__ for item in "abc")
    assert kinds == ["Interrupt", "RuntimeError", "RuntimeError"]
    assert writer.submit("after") == "done:after"
