"""Group commit of single enqueues against real PostgreSQL and Redis: concurrent requests share a
transaction, each gets its own job, Redis hears of them only after the commit, and one
request's idempotency conflict fails that request alone."""

from __future__ import annotations

import threading

import pytest

from taskline.dispatch.keys import QueueKeys
from taskline.errors import IdempotencyConflict
from taskline_producer.coalescer import Coalescer, Item
from taskline_producer.enqueuer import Accepted, Enqueuer
from taskline_producer.jobspec import JobSpec, parse_job
from taskline_producer.telemetry import JobMetrics
from tests.helpers import wait_for

KEYS = QueueKeys("default")


def spec(settings, key: str | None = None, **body: object) -> JobSpec:
    parsed = parse_job({"type": "echo", "payload": body or {"n": 1}}, settings, key)
    assert isinstance(parsed, JobSpec)
    return parsed


class Gated:
    """The enqueuer's group commit, held at a gate so the test decides what each group holds;
    records the size of every group it writes and what Redis held at each commit."""

    def __init__(self, enqueuer: Enqueuer, dispatcher) -> None:
        self.enqueuer, self.dispatcher = enqueuer, dispatcher
        self.gate = threading.Event()
        self.groups: list[int] = []
        self.ready_at_commit: list[int] = []
        self.coalescer = Coalescer(self.commit, enqueuer.publish, enqueuer._alone)

    def commit(self, items: list[Item]) -> list[Accepted]:
        self.groups.append(len(items))
        assert self.gate.wait(10)
        answers = self.enqueuer.commit(items)
        self.ready_at_commit.append(self.dispatcher.client.llen(KEYS.ready(5)))
        return answers


def submit_all(coalescer: Coalescer, items: list[Item]) -> tuple[list, list[threading.Thread]]:
    """Submit each item from its own thread; answers (or errors) land in the returned list."""
    out: list = [None] * len(items)

    def one(i: int) -> None:
        try:
            out[i] = coalescer.submit(items[i])
        except Exception as err:
            out[i] = err

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(items))]
    for thread in threads:
        thread.start()
    return out, threads


@pytest.fixture
def enqueuer(store, dispatcher) -> Enqueuer:
    return Enqueuer(store, dispatcher, JobMetrics())


def test_waiting_requests_share_one_transaction_and_each_gets_its_own_job(
        store, dispatcher, settings, enqueuer):
    gated = Gated(enqueuer, dispatcher)
    first, t1 = submit_all(gated.coalescer, [(spec(settings), None)])
    wait_for(lambda: gated.groups == [1], message="first group at the gate")
    rest, t2 = submit_all(gated.coalescer, [(spec(settings, n=i), f"trace-{i}") for i in range(6)])
    wait_for(lambda: len(gated.coalescer._pending) == 6, message="six requests waiting")
    gated.gate.set()
    for thread in t1 + t2:
        thread.join(10)

    assert gated.groups == [1, 6]
    answers = first + rest
    assert all(isinstance(a, Accepted) and a.created for a in answers)
    ids = [str(a.job.id) for a in answers]
    assert len(set(ids)) == 7
    # Commit before push: Redis held only the first group's job when the second committed.
    assert gated.ready_at_commit == [0, 1]
    assert sorted(dispatcher.list_range(KEYS.ready(5), 0, -1)) == sorted(ids)
    created = {store.get_job(a.job.id).created_at for a in rest}
    assert len(created) == 1  # created_at is the transaction's start: one transaction
    assert [store.get_job(a.job.id).payload for a in rest] == [{"n": i} for i in range(6)]


def test_a_conflict_in_a_group_fails_only_its_own_request(store, dispatcher, settings, enqueuer):
    gated = Gated(enqueuer, dispatcher)
    _, t1 = submit_all(gated.coalescer, [(spec(settings), None)])
    wait_for(lambda: gated.groups == [1], message="first group at the gate")
    items = [(spec(settings, "k", n=1), None), (spec(settings, n=2), None),
             (spec(settings, "k", n=99), None), (spec(settings, n=3), None)]
    rest, t2 = submit_all(gated.coalescer, items)
    wait_for(lambda: len(gated.coalescer._pending) == 4, message="four requests waiting")
    gated.gate.set()
    for thread in t1 + t2:
        thread.join(10)

    assert gated.groups == [1, 4]  # the group of 4 failed whole, then each went alone
    conflicts = [a for a in rest if isinstance(a, IdempotencyConflict)]
    accepted = [a for a in rest if isinstance(a, Accepted)]
    assert len(conflicts) == 1 and len(accepted) == 3
    assert all(a.created for a in accepted)
    keyed = [a for a in accepted if a.job.idempotency_key == "k"]
    assert len(keyed) == 1
    assert len(dispatcher.list_range(KEYS.ready(5), 0, -1)) == 4  # 1 + 3, none twice


def test_a_replay_in_the_same_group_gets_the_same_job(store, dispatcher, settings, enqueuer):
    gated = Gated(enqueuer, dispatcher)
    _, t1 = submit_all(gated.coalescer, [(spec(settings), None)])
    wait_for(lambda: gated.groups == [1], message="first group at the gate")
    rest, t2 = submit_all(gated.coalescer, [(spec(settings, "same"), None)] * 2)
    wait_for(lambda: len(gated.coalescer._pending) == 2, message="two requests waiting")
    gated.gate.set()
    for thread in t1 + t2:
        thread.join(10)

    assert all(isinstance(a, Accepted) for a in rest)
    assert rest[0].job.id == rest[1].job.id
    assert sorted(a.created for a in rest) == [False, True]
    assert dispatcher.list_range(KEYS.ready(5), 0, -1).count(str(rest[0].job.id)) == 1


def test_concurrent_single_enqueues_through_the_enqueuer(store, dispatcher, settings, enqueuer):
    barrier = threading.Barrier(12)
    out: list = [None] * 12

    def one(i: int) -> None:
        barrier.wait()
        out[i] = enqueuer.enqueue(spec(settings, n=i))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert all(isinstance(a, Accepted) and a.created for a in out)
    assert sorted(store.get_job(a.job.id).payload["n"] for a in out) == list(range(12))
    assert len(dispatcher.list_range(KEYS.ready(5), 0, -1)) == 12
