"""The list lane's classification and admission (taskline_producer.http.lanes), and which list
requests the event loop may answer from the list cache (taskline_producer.http.listcache),
without sockets."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from flask import Flask

from taskline_producer.http.lanes import ListLane, is_list_read
from taskline_producer.http.listcache import ListCache, Raw, loop_may_answer


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
    assert lane.done(a) == [c]  # the oldest waiting one runs in a's slot
    assert lane.running == 2
    assert lane.done(SimpleNamespace()) == []  # not a lane read: changes nothing
    assert lane.done(b) == [d]
    assert lane.done(c) == [] and lane.done(d) == []
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
    assert lane.done(admitted[0]) == []  # no token: the slot is not handed on at once
    time.sleep(0.26)
    started = lane.due()
    assert started == conns[20:20 + len(started)] and 4 <= len(started) <= 7  # in order
    assert lane.running == 19 + len(started)


def test_an_unpaced_lane_has_nothing_due():
    lane = ListLane(1)
    first, second = SimpleNamespace(), SimpleNamespace()
    assert lane.admit(first) and not lane.admit(second)
    assert lane.next_due_s() is None and lane.due() == []
    assert lane.done(first) == [second]


def test_quick_reads_take_a_token_but_no_slot_and_pass_reads_waiting_for_one():
    lane = ListLane(1, quick=lambda conn: conn.quick)
    slow, waits, quick = (SimpleNamespace(quick=q) for q in (False, False, True))
    assert lane.admit(slow) and slow.lane_slot
    assert not lane.admit(waits)  # no slot
    assert lane.admit(quick) and not quick.lane_slot  # answered by the loop, slot or not
    assert lane.running == 1 and list(lane.waiting) == [waits]
    assert lane.done(quick) == []  # held no slot: hands none on
    assert lane.done(slow) == [waits] and waits.lane_slot


def test_a_paced_quick_read_waits_for_a_token_in_order_and_falls_back_to_a_slot():
    lane = ListLane(1, rate=2, quick=lambda conn: conn.quick)
    first, second, third = (SimpleNamespace(quick=True) for _ in range(3))
    assert lane.admit(first) and lane.admit(second)  # one second's worth: 2 tokens
    assert not lane.admit(third)  # no token: it waits, in order
    assert lane.due() == [] and 0 < (lane.next_due_s() or 0) <= 0.5
    time.sleep(0.55)
    assert lane.due() == [third] and not third.lane_slot
    # Its cache entry expired before the loop answered it: it waits at the head for a slot.
    third.quick = False
    assert lane.wait_for_slot(third) == [] and list(lane.waiting) == [third]
    time.sleep(0.55)
    assert lane.due() == [third] and third.lane_slot and lane.running == 1


@pytest.mark.parametrize("message", [
    b"GET /api/v1/workflows HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /api/v1/workflows?limit=10 HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n",
    b"GET /api/v1/workflows HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\n\r\n"])
def test_the_loop_may_answer_repeated_workflow_lists(message: bytes):
    assert loop_may_answer(message)


@pytest.mark.parametrize("message", [
    b"GET /api/v1/workflows HTTP/1.0\r\nHost: x\r\n\r\n",  # its connection would close
    b"GET /api/v1/workflows HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /api/v1/workflows HTTP/1.1\r\nConnection: keep-alive, Upgrade\r\n\r\n",
    b"GET /api/v1/workflows HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
    b"GET /api/v1/workflows HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n\r\n",
    b"GET /api/v1/workflows/0193e0c2 HTTP/1.1\r\nHost: x\r\n\r\n",  # a workflow's steps
    b"GET /api/v1/jobs HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST /api/v1/workflows HTTP/1.1\r\nHost: x\r\n\r\n",
    b"HEAD /api/v1/workflows HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /api/v1/workflows HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 8192 + b"\r\n\r\n"])
def test_other_requests_go_to_flask(message: bytes):
    assert not loop_may_answer(message)


def test_a_loop_answer_expires_with_its_entry_and_with_a_change():
    cache, app = ListCache(30.0), Flask(__name__)  # an app without authentication
    message = b"GET /api/v1/workflows HTTP/1.1\r\nHost: x\r\n\r\n"
    cache.put_raw(message, Raw(time.monotonic() - 0.001, b"{}", None))
    assert cache.answer_on_loop(app, message) is None  # expired
    cache.put_raw(message, Raw(time.monotonic() + 30, b'{"workflows": []}', None))
    answer = cache.answer_on_loop(app, message)
    assert answer is not None
    head, _, body = answer.partition(b"\r\n\r\n")
    assert body == b'{"workflows": []}'
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"\r\nContent-Length: 17" in head and b"\r\nConnection: keep-alive" in head
    assert cache.answer_on_loop(app, message.replace(b"x", b"y")) is None  # other bytes
    cache.clear()  # what a submit or cancel in this process does
    assert cache.answer_on_loop(app, message) is None
