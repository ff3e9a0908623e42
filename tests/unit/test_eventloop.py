"""The worker's event loop (taskline.execution.eventloop): results and errors reported from the
loop's thread, a cancel from another thread (even before the task started), the lag a blocking
coroutine shows while it holds the loop, and a fresh loop after a stop."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from taskline.execution.eventloop import LOOP_THREAD, EventLoop, on_event_loop


class Ends:
    """Collects what `ended` reports, and on which thread."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = ""
        self.on_loop = False

    def __call__(self, result: Any, error: BaseException | None) -> None:
        self.result, self.error = result, error
        self.thread = threading.current_thread().name
        self.on_loop = on_event_loop()
        self.done.set()


@pytest.fixture
def loop():
    running = EventLoop()
    yield running
    running.stop()


def test_a_result_and_an_error_are_reported_on_the_loop_thread(loop):
    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    async def broken() -> None:
        raise ValueError("no")

    ok, bad = Ends(), Ends()
    loop.run(answer, ok)
    loop.run(broken, bad)
    assert ok.done.wait(5) and bad.done.wait(5)
    assert (ok.result, ok.error, ok.thread, ok.on_loop) == (42, None, LOOP_THREAD, True)
    assert isinstance(bad.error, ValueError) and bad.result is None
    assert not on_event_loop()


def test_a_cancel_ends_a_running_task_and_one_not_yet_started():
    loop = EventLoop()
    try:
        started = threading.Event()

        async def forever() -> None:
            started.set()
            await asyncio.sleep(3600)

        running = Ends()
        cancel = loop.run(forever, running)
        assert started.wait(5)
        cancel()
        assert running.done.wait(5)
        assert isinstance(running.error, asyncio.CancelledError)

        holding, hold = threading.Event(), threading.Event()

        async def blocking() -> None:
            holding.set()
            hold.wait(5)  # holds the loop: the next task cannot start before its cancel

        loop.run(blocking, Ends())
        assert holding.wait(5)
        never_ran: list[bool] = []

        async def body() -> None:
            never_ran.append(True)

        early = Ends()
        loop.run(body, early)()
        hold.set()
        assert early.done.wait(5)
        assert isinstance(early.error, asyncio.CancelledError) and never_ran == []
    finally:
        loop.stop()


def test_the_lag_shows_a_loop_held_by_blocking_code(loop):
    assert loop.lag_s() == 0.0  # no loop yet
    release = threading.Event()

    async def block() -> None:
        release.wait(5)

    ended = Ends()
    loop.run(block, ended)
    deadline = time.monotonic() + 5
    while loop.lag_s() < 0.3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert loop.lag_s() >= 0.3
    release.set()
    assert ended.done.wait(5)
    deadline = time.monotonic() + 5
    while loop.lag_s() > 0.05 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert loop.lag_s() <= 0.05


def test_a_stopped_loop_is_replaced_by_a_fresh_one_on_the_next_run(loop):
    async def one() -> int:
        return 1

    first = Ends()
    loop.run(one, first)
    assert first.done.wait(5)
    loop.stop()
    assert loop.lag_s() == 0.0
    again = Ends()
    loop.run(one, again)
    assert again.done.wait(5) and again.result == 1
