"""The handler pool's hand-off: a caller about to block steps aside until a pool thread has
taken what it submitted, and never longer than its bound when no thread is free; and a job
submitted by a pool thread finishing another (a workflow step its parent's success started)
runs next on that thread, unless work already waits for a thread."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from taskline.execution.attempts import Attempt
from taskline.execution.deadlines import Deadlines
from taskline.execution.runner import Runner
from taskline.handlers import registry
from tests.helpers import wait_for
from tests.unit.test_worker_attempts import make_attempt

TYPE = "test.runner.gate"


class Gate:
    """The registered handler: records each start, then waits until opened."""

    def __init__(self) -> None:
        self.started: list[uuid.UUID] = []
        self.first_started = threading.Event()
        self.open = threading.Event()

    def __call__(self, payload: object, ctx: registry.JobContext) -> None:
        self.started.append(ctx.job_id)
        self.first_started.set()
        self.open.wait(10)


@pytest.fixture
def gate() -> Iterator[Gate]:
    gate = Gate()
    registry.handler(TYPE)(gate)
    yield gate
    gate.open.set()
    registry._registry.pop(TYPE, None)


def attempt() -> Attempt:
    return make_attempt(sent_at=time.monotonic(), job_type=TYPE)


@pytest.fixture
def runner() -> Iterator[tuple[Runner, list[Attempt]]]:
    finished: list[Attempt] = []
    pool = Runner(1, Deadlines(), on_finished=lambda a, *_: finished.append(a),
                  on_timeout=lambda a: None, on_recycle=lambda: None)
    pool.start()
    yield pool, finished
    pool.stop()


def test_hand_off_returns_as_soon_as_an_idle_thread_took_the_job(gate, runner):
    pool, _ = runner
    first = attempt()
    pool.submit(first)
    began = time.monotonic()
    pool.hand_off(max_s=10.0)
    # Long before its bound: it ended because the thread took the job.
    assert time.monotonic() - began < 10.0
    assert gate.first_started.wait(5) and gate.started == [first.job.id]


def test_hand_off_does_not_wait_for_a_job_no_thread_is_free_to_take(gate, runner):
    pool, finished = runner
    busy, waiting = attempt(), attempt()
    pool.submit(busy)
    assert gate.first_started.wait(5)  # the only thread is now held by `busy`
    pool.submit(waiting)  # a job claimed ahead: it waits for the thread
    began = time.monotonic()
    pool.hand_off(max_s=5.0)
    assert time.monotonic() - began < 2.5  # at once, not after its 5 s bound
    assert gate.started == [busy.job.id]  # `waiting` is still queued, not lost
    gate.open.set()
    wait_for(lambda: len(finished) == 2, timeout=5, interval=0.01, message="both jobs ended")
    assert finished == [busy, waiting] and gate.started == [busy.job.id, waiting.job.id]


THREADS = "test.runner.threads"


def _chain_pool(then: dict[uuid.UUID, Attempt], threads: int) -> tuple[Runner, list[Attempt]]:
    """A pool whose on_finished submits `then[job id]`, as a step's success submits the step
    it started, and hands off as the worker does."""
    finished: list[Attempt] = []

    def on_finished(done: Attempt, *_: object) -> None:
        finished.append(done)
        if done.job.id in then:
            pool.submit(then[done.job.id])
            pool.hand_off(max_s=5.0)

    pool = Runner(threads, Deadlines(), on_finished=on_finished, on_timeout=lambda a: None,
                  on_recycle=lambda: None)
    return pool, finished


@pytest.fixture
def thread_names() -> Iterator[dict[uuid.UUID, str]]:
    names: dict[uuid.UUID, str] = {}
    registry.handler(THREADS)(lambda payload, ctx: names.__setitem__(
        ctx.job_id, threading.current_thread().name))
    yield names
    registry._registry.pop(THREADS, None)


def test_a_job_submitted_while_finishing_runs_next_on_the_same_thread(thread_names):
    chain = [make_attempt(lease_id=n, job_type=THREADS) for n in range(1, 6)]
    then = {a.job.id: b for a, b in itertools.pairwise(chain)}
    pool, finished = _chain_pool(then, threads=4)
    pool.start()
    began = time.monotonic()
    pool.submit(chain[0])
    wait_for(lambda: len(finished) == 5, timeout=5, interval=0.01, message="chain ran")
    pool.stop()
    assert finished == chain
    assert len({thread_names[a.job.id] for a in chain}) == 1, thread_names
    assert time.monotonic() - began < 4.0, "no hand-off waited its bound on a pool thread"


def test_a_job_submitted_while_work_waits_for_a_thread_takes_its_turn(gate, thread_names):
    parent, child = make_attempt(lease_id=1, job_type=THREADS), make_attempt(lease_id=2,
                                                                             job_type=THREADS)
    blocker, waiting = attempt(), attempt()
    pool, finished = _chain_pool({parent.job.id: child}, threads=1)
    pool.start()
    pool.submit(blocker)
    assert gate.first_started.wait(5)
    pool.submit(parent)
    pool.submit(waiting)  # queued before the child: the child must not overtake it
    gate.open.set()
    wait_for(lambda: len(finished) == 4, timeout=5, interval=0.01, message="all ran")
    pool.stop()
    assert finished == [blocker, parent, waiting, child]
