"""The list lane's classification and admission (taskline_producer.http.lanes), and which list
requests the event loop may answer from the list cache (taskline_producer.http.listcache),
without sockets."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from taskline_producer.http.lanes import ListLane, is_list_read
from taskline_producer.http.listcache import ListCache, loop_may_answer


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


@pytest.mark.parametrize("message", [
    b"GET /api/v1/workflows HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /api/v1/workflows?limit=10 HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n",
    b"GET /api/v1/workflows HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n"])
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
    b"HEAD /api/v1/workflows HTTP/1.1\r\nHost: x\r\n\r\n"])
def test_other_requests_go_to_flask(message: bytes):
    assert not loop_may_answer(message)


def test_a_loop_answer_expires_with_its_entry_and_with_a_change():
    cache = ListCache(30.0, on_loop=True)
    message = b"GET /api/v1/workflows HTTP/1.1\r\nHost: x\r\n\r\n"
    cache.put_raw(message, time.monotonic() - 0.001, b"{}")
    assert cache.answer_on_loop(message) is None  # expired
    cache.put_raw(message, time.monotonic() + 30, b'{"workflows": []}')
    answer = cache.answer_on_loop(message)
    assert answer is not None
    head, _, body = answer.partition(b"\r\n\r\n")
    assert body == b'{"workflows": []}'
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"\r\nContent-Length: 17" in head and b"\r\nConnection: keep-alive" in head
    cache.clear()  # what a submit or cancel in this process does
    assert cache.answer_on_loop(message) is None
