"""Every Lua script of the dispatcher against a real Redis."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from taskline.dispatch.dispatcher import SIGNAL_MAX, Dispatcher
from taskline.dispatch.keys import QUEUES_SET, QueueKeys

Q = QueueKeys("default")


def ids(n: int) -> list[str]:
    return [str(uuid.uuid4()) for _ in range(n)]


def test_push_then_fetch_is_fifo_within_a_priority(dispatcher: Dispatcher):
    jobs = ids(5)
    dispatcher.push([("default", 5, j) for j in jobs])
    assert dispatcher.fetch("default", "w1", 10) == jobs
    assert dispatcher.client.lrange(Q.processing("w1"), 0, -1) == list(reversed(jobs))
    assert dispatcher.client.sismember(QUEUES_SET, "default")


def test_fetch_takes_strictly_by_priority(dispatcher: Dispatcher):
    low, normal, urgent = ids(3)
    dispatcher.push([("default", 0, low), ("default", 5, normal), ("default", 9, urgent)])
    assert dispatcher.fetch("default", "w1", 1) == [urgent]
    assert dispatcher.fetch("default", "w1", 5) == [normal, low]
    assert dispatcher.fetch("default", "w1", 5) == []


def test_fetch_wakes_another_worker_when_work_remains(dispatcher: Dispatcher):
    dispatcher.push([("default", 5, j) for j in ids(3)])
    dispatcher.client.delete(Q.signal)
    dispatcher.fetch("default", "w1", 1)
    assert dispatcher.client.llen(Q.signal) == 1
    dispatcher.client.delete(Q.signal)
    dispatcher.fetch("default", "w1", 2)
    assert dispatcher.client.llen(Q.signal) == 0


def test_push_signals_are_bounded(dispatcher: Dispatcher):
    dispatcher.push([("default", 5, j) for j in ids(SIGNAL_MAX * 3)])
    assert dispatcher.client.llen(Q.signal) == SIGNAL_MAX
    assert len(dispatcher.wait_and_fetch(["default"], "w1", 10)) == 10


def test_wait_and_fetch_blocks_until_timeout_when_idle(dispatcher: Dispatcher):
    started = time.monotonic()
    assert dispatcher.wait_and_fetch(["default", "other"], "w1", 5) == []
    assert time.monotonic() - started >= dispatcher.block_timeout_s * 0.9


def test_wait_and_fetch_takes_a_push_that_arrives_while_waiting(dispatcher: Dispatcher):
    (job,) = ids(1)
    pusher = threading.Timer(0.05, dispatcher.push, [[("default", 5, job)]])
    pusher.start()
    started = time.monotonic()
    assert dispatcher.wait_and_fetch(["default"], "w1", 5) == [job]
    assert time.monotonic() - started < dispatcher.block_timeout_s
    assert dispatcher.client.lrange(Q.processing("w1"), 0, -1) == [job]
    pusher.join()


def test_wait_and_fetch_leaves_other_queues_to_the_next_fetch(dispatcher: Dispatcher):
    (job,) = ids(1)
    dispatcher.push([("other", 5, job)])
    assert dispatcher.wait_and_fetch(["default", "other"], "w1", 5) == []
    assert dispatcher.fetch("other", "w1", 5) == [job]


def test_retry_later_and_promote(dispatcher: Dispatcher):
    (job,) = ids(1)
    dispatcher.push([("default", 3, job)])
    dispatcher.fetch("default", "w1", 1)
    dispatcher.retry_later("default", "w1", job, 1234)
    assert dispatcher.client.llen(Q.processing("w1")) == 0
    assert dispatcher.client.zscore(Q.retry, job) == 1234
    assert dispatcher.promote("default", 3, [job]) == 1
    assert dispatcher.client.zcard(Q.retry) == 0
    assert dispatcher.fetch("default", "w2", 1) == [job]


def test_schedule_and_unschedule(dispatcher: Dispatcher):
    a, b = ids(2)
    dispatcher.schedule("default", a, 10)
    dispatcher.schedule("default", b, 20, retry=True)
    assert dispatcher.client.zscore(Q.scheduled, a) == 10
    assert dispatcher.client.zscore(Q.retry, b) == 20
    dispatcher.unschedule("default", a)
    dispatcher.unschedule("default", b)
    assert dispatcher.client.zcard(Q.scheduled) == dispatcher.client.zcard(Q.retry) == 0


def test_dead_letter_moves_out_of_processing(dispatcher: Dispatcher):
    (job,) = ids(1)
    dispatcher.push([("default", 5, job)])
    dispatcher.fetch("default", "w1", 1)
    dispatcher.dead_letter("default", "w1", job)
    assert dispatcher.client.lrange(Q.dlq, 0, -1) == [job]
    assert dispatcher.client.llen(Q.processing("w1")) == 0
    dispatcher.remove_from_dlq("default", job)
    assert dispatcher.client.llen(Q.dlq) == 0


def test_drop_dead_removes_ids_from_the_tail_and_keeps_the_order_of_the_rest(
        dispatcher: Dispatcher):
    dead = ids(2500)  # more than one chunk of the script's read
    dispatcher.client.lpush(Q.dlq, *dead)  # the oldest (dead[0]) at the tail
    doomed = [*dead[:1200], dead[1500], dead[1200]]  # in any order, one twice in the list
    dispatcher.client.lpush(Q.dlq, dead[1200])
    absent = ids(1)

    removed = dispatcher.drop_dead("default", [*doomed, *absent])

    assert removed == 1203
    kept = [d for d in dead if d not in set(doomed)]
    assert dispatcher.client.lrange(Q.dlq, 0, -1) == list(reversed(kept))
    assert dispatcher.drop_dead("default", []) == 0


def test_drop_dead_stops_reading_once_every_id_was_found(dispatcher: Dispatcher):
    dead = ids(3000)
    dispatcher.client.lpush(Q.dlq, *dead)
    dispatcher.client.lpush(Q.dlq, dead[0])  # a copy at the head, removed only by a full read
    assert dispatcher.drop_dead("default", dead[:10]) == 10
    assert dispatcher.client.lindex(Q.dlq, 0) == dead[0]
    assert dispatcher.client.llen(Q.dlq) == 2991


def test_requeue_puts_the_id_next_in_line(dispatcher: Dispatcher):
    first, second = ids(2)
    dispatcher.push([("default", 5, first), ("default", 5, second)])
    assert dispatcher.fetch("default", "w1", 1) == [first]
    assert dispatcher.requeue("default", 5, first, "w1", always=False)
    assert dispatcher.fetch("default", "w2", 1) == [first]


def test_requeue_if_present_does_nothing_for_an_absent_id(dispatcher: Dispatcher):
    (job,) = ids(1)
    assert not dispatcher.requeue("default", 5, job, "w1", always=False)
    assert dispatcher.client.llen(Q.ready(5)) == 0
    assert dispatcher.requeue("default", 5, job, "w1", always=True)
    assert dispatcher.client.lrange(Q.ready(5), 0, -1) == [job]


def test_ack_removes_from_processing(dispatcher: Dispatcher):
    jobs = ids(3)
    dispatcher.push([("default", 5, j) for j in jobs])
    dispatcher.fetch("default", "w1", 3)
    dispatcher.ack([("default", jobs[0]), ("default", jobs[2])], "w1")
    assert dispatcher.client.lrange(Q.processing("w1"), 0, -1) == [jobs[1]]


def test_snapshot_copies_lists_and_sets_into_one_set(dispatcher: Dispatcher):
    ready, retry, processing = ids(7000), ids(3), ids(2)
    dispatcher.push([("default", 5, j) for j in ready])
    for j in retry:
        dispatcher.schedule("default", j, 1, retry=True)
    dispatcher.client.lpush(Q.processing("w9"), *processing, processing[0])
    dest = Q.snapshot("seen")
    n = dispatcher.snapshot(dest, [Q.ready(5), Q.retry, Q.processing("w9"), Q.ready(1)], 60)
    assert n == 7005
    assert dispatcher.members(dest, [ready[-1], retry[0], processing[1], "nope"]) == [
        True, True, True, False]
    assert 0 < dispatcher.client.ttl(dest) <= 60
    chunks = list(dispatcher.scan_set(dest, count=1000))
    assert sum(len(c) for c in chunks) >= 7005 and all(chunks)


def test_depths_reports_every_structure(dispatcher: Dispatcher):
    dispatcher.push([("default", 9, j) for j in ids(2)] + [("default", 0, j) for j in ids(1)])
    dispatcher.fetch("default", "w1", 1)
    dispatcher.schedule("default", "x", 5)
    depths = dispatcher.depths("default")
    assert depths["ready"][9] == 1 and depths["ready"][0] == 1
    assert depths["processing"] == 1 and depths["scheduled"] == 1
    assert depths["retry"] == 0 and depths["dlq"] == 0


def commandstats(client) -> dict[str, int]:
    """Calls per command since the server's last CONFIG RESETSTAT (that one left out)."""
    return {name.removeprefix("cmdstat_"): stats["calls"]
            for name, stats in client.info("commandstats").items()
            if name != "cmdstat_config|resetstat"}


def test_a_push_is_one_round_trip_without_script_exists(private_redis):
    """Shared servers' stats and script cache are not ours to flush: a private Redis."""
    dispatcher = Dispatcher(private_redis.url)
    try:
        (first,) = ids(1)
        dispatcher.push([("default", 5, first)])  # loads the script once
        dispatcher.client.config_resetstat()
        jobs = ids(3)
        dispatcher.push([("default", 5, jobs[0]), ("default", 9, jobs[1]),
                         ("other", 5, jobs[2])])
        assert commandstats(dispatcher.client) == {"evalsha": 3, "lpush": 6, "ltrim": 3,
                                                   "sadd": 1}
        assert dispatcher.fetch("default", "w1", 5) == [jobs[1], first, jobs[0]]
        assert dispatcher.fetch("other", "w1", 5) == [jobs[2]]
    finally:
        dispatcher.close()


def test_a_push_after_script_flush_loads_the_script_and_pushes_once(private_redis):
    dispatcher = Dispatcher(private_redis.url)
    try:
        dispatcher.push([("default", 5, ids(1)[0])])
        dispatcher.client.script_flush()
        jobs = ids(2)
        assert dispatcher.push([("default", 5, jobs[0]), ("default", 9, jobs[1])]) == 2
        assert dispatcher.list_range(Q.ready(9), 0, -1) == [jobs[1]]
        assert dispatcher.list_range(Q.ready(5), 0, -1).count(jobs[0]) == 1
        assert dispatcher.client.script_exists(dispatcher._scripts["push"].sha) == [True]
    finally:
        dispatcher.close()


def test_an_ack_is_one_script_call_per_processing_list(private_redis):
    """A settled batch's ids leave each list in one call, not a command per id."""
    dispatcher = Dispatcher(private_redis.url)
    try:
        jobs, other = ids(4), ids(2)
        dispatcher.push([("default", 5, j) for j in jobs] + [("other", 5, j) for j in other])
        dispatcher.fetch("default", "w1", 4)
        dispatcher.fetch("other", "w1", 2)
        dispatcher.ack([("default", jobs[0])], "w1")  # loads the script once
        dispatcher.client.config_resetstat()
        dispatcher.ack([("default", jobs[1]), ("default", jobs[3])], "w1")
        assert commandstats(dispatcher.client) == {"evalsha": 1, "lrem": 2}
        dispatcher.client.config_resetstat()
        dispatcher.ack([("default", jobs[2]), ("other", other[1])], "w1")
        assert commandstats(dispatcher.client) == {"evalsha": 2, "lrem": 2}
        assert dispatcher.list_range(Q.processing("w1"), 0, -1) == []
        assert dispatcher.list_range(QueueKeys("other").processing("w1"), 0, -1) == [other[0]]
    finally:
        dispatcher.close()


@pytest.mark.parametrize("queues", [["default"], ["default", "other"]])
def test_an_ack_after_script_flush_loads_the_script_and_acks_once(private_redis, queues):
    dispatcher = Dispatcher(private_redis.url)
    try:
        fetched = {}
        for queue in queues:
            jobs = ids(2)
            dispatcher.push([(queue, 5, j) for j in jobs])
            # A copy of the first id twice (a push's duplicate): an ack drops one copy only.
            dispatcher.push([(queue, 5, jobs[0])])
            fetched[queue] = dispatcher.fetch(queue, "w1", 3)
        dispatcher.client.script_flush()
        dispatcher.ack([(q, j) for q, jobs in fetched.items() for j in jobs[:2]], "w1")
        for queue, jobs in fetched.items():
            assert sorted(dispatcher.list_range(QueueKeys(queue).processing("w1"), 0, -1)) == [
                jobs[2]]
        assert dispatcher.client.script_exists(dispatcher._scripts["ack"].sha) == [True]
    finally:
        dispatcher.close()


def test_wait_and_fetch_after_a_script_flush_still_fetches_in_that_call(private_redis):
    """The wait took the push's signal, so a fetch left to the next wait would sleep a whole
    block timeout (here 30 s) before the job ran."""
    dispatcher = Dispatcher(private_redis.url, block_timeout_s=30)
    try:
        (job,) = ids(1)
        dispatcher.push([("default", 5, job)])
        dispatcher.client.script_flush()
        assert dispatcher.wait_and_fetch(["default"], "w1", 5) == [job]
        assert dispatcher.list_range(Q.ready(5), 0, -1) == []
        assert dispatcher.list_range(Q.processing("w1"), 0, -1) == [job]
        assert dispatcher.list_range(Q.signal, 0, -1) == []  # the signal was taken
        assert dispatcher.client.script_exists(dispatcher._scripts["fetch"].sha) == [True]
    finally:
        dispatcher.close()


def test_depths_of_many_queues_equal_each_one_s_depths(dispatcher: Dispatcher):
    dispatcher.push([("default", 9, j) for j in ids(2)] + [("mail", 3, j) for j in ids(3)])
    dispatcher.fetch("default", "w1", 1)
    dispatcher.fetch("mail", "w2", 2)
    dispatcher.schedule("mail", "x", 5)
    # A processing list of a worker the registry does not know (fetched before it registered):
    dispatcher.client.rpush(QueueKeys("mail").processing("w-unregistered"), "y")
    queues = ["default", "mail", "empty"]
    assert dispatcher.processing_lists_of(queues) == {
        q: dispatcher.processing_lists(q) for q in queues}
    assert dispatcher.processing_lists_of(queues)["mail"] == [
        QueueKeys("mail").processing("w-unregistered"), QueueKeys("mail").processing("w2")]
    assert dispatcher.depths_of(queues) == {q: dispatcher.depths(q) for q in queues}
    assert dispatcher.depths_of(queues)["mail"]["processing"] == 3
