"""The list lane's classification and admission (taskline_producer.http.lanes), without sockets."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from taskline_producer.http.lanes import ListLane, is_list_read


@pytest.mark.parametrize("line", [
    b"GET /api/v1/jobs HTTP/1.1\r\n", b"GET /api/v1/jobs?status=dead&limit=100 HTTP/1.1\r\n",
    b"GET /api/v1/workflows HTTP/1.1\r\n", b"GET /api/v1/workflows/0193e0c2?cursor=x HTTP/1.1\r\n",
    b"GET /api/v1/dlq HTTP/1.1\r\n", b"GET /api/v1/dlq/groups HTTP/1.1\r\n",
    b"GET /api/v1/audit?limit=10 HTTP/1.1\r\n", b"GET /api/v1/queues HTTP/1.1\r\n",
    b"GET /api/v1/schedules HTTP/1.1\r\n"])
def test_list_and_page_reads_take_the_lane(line: bytes):
    assert is_list_read(line + b"Host: x\r\n\r\n")


@pytest.mark.parametrize("line", [
    b"POST /api/v1/jobs HTTP/1.1\r\n", b"GET /api/v1/jobs/0193e0c2 HTTP/1.1\r\n",
    b"POST /api/v1/workflows HTTP/1.1\r\n", b"GET /api/v1/queues/default HTTP/1.1\r\n",
    b"GET /healthz HTTP/1.1\r\n", b"GET /api/v1/jobsx HTTP/1.1\r\n",
    b"DELETE /api/v1/workflows/0193e0c2 HTTP/1.1\r\n", b"GET /api/v1/events HTTP/1.1\r\n"])
def test_other_requests_do_not(line: bytes):
    assert not is_list_read(line + b"Host: x\r\n\r\n")


def test_reads_beyond_the_limit_wait_in_order_and_take_the_freed_slot():
    lane = ListLane(2)
    a, b, c, d = (SimpleNamespace(name=n) for n in "abcd")
    assert [lane.admit(x) for x in (a, b, c, d)] == [True, True, False, False]
    assert lane.done(a) is c  # the oldest waiting one runs in a's slot
    assert lane.running == 2
    assert lane.done(SimpleNamespace()) is None  # not a lane read: changes nothing
    assert lane.done(b) is d
    assert lane.done(c) is None and lane.done(d) is None
    assert lane.running == 0 and not lane.waiting


def test_a_stopping_worker_runs_every_waiting_read():
    lane = ListLane(1)
    first, *rest = [SimpleNamespace() for _ in range(4)]
    assert lane.admit(first)
    for conn in rest:
        assert not lane.admit(conn)
    assert lane.release_all() == rest
    assert lane.running == 4


def test_a_paced_lane_starts_at_most_its_rate_and_the_rest_in_turn():
    lane = ListLane(100, rate=20)
    conns = [SimpleNamespace(name=n) for n in range(40)]
    admitted = [c for c in conns if lane.admit(c)]
    assert admitted == conns[:20]  # one second's worth of tokens
    assert lane.due() == []
    assert 0 < (lane.next_due_s() or 0) <= 0.05
    assert lane.done(admitted[0]) is None  # no token: the slot is not handed on at once
    time.sleep(0.26)
    started = lane.due()
    assert started == conns[20:20 + len(started)] and 4 <= len(started) <= 7  # in order
    assert lane.running == 19 + len(started)


def test_an_unpaced_lane_has_nothing_due():
    lane = ListLane(1)
    first, second = SimpleNamespace(), SimpleNamespace()
    assert lane.admit(first) and not lane.admit(second)
    assert lane.next_due_s() is None and lane.due() == []
    assert lane.done(first) is second
