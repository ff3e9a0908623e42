"""The clients' connection pools and cheap keys, and AsyncClient's retry rules, against the
scripted HTTP server of test_client_retries (a thread on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import multiprocessing
import uuid
from http.server import ThreadingHTTPServer
from typing import Any

import pytest

from taskline.client import AsyncClient, Client, ClientError
from tests.helpers import wait_for
from tests.integration.test_client_retries import CREATED, THEN_CLOSE, UNAVAILABLE
from tests.integration.test_client_retries import api as api  # the fixture, re-exported


def _url(server: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def test_requests_reuse_one_connection(api: ThreadingHTTPServer) -> None:
    api.script = [CREATED]
    with Client(_url(api)) as client:
        for _ in range(5):
            client.enqueue("echo")
        client.get("x")
    assert len({seen["port"] for seen in api.seen}) == 1


def test_keys_are_uuid_shaped_distinct_and_per_client(api: ThreadingHTTPServer) -> None:
    api.script = [CREATED]
    with Client(_url(api)) as one, Client(_url(api)) as two:
        for _ in range(3):
            one.enqueue("echo")
            two.enqueue("echo")
    keys = [seen["body"]["idempotency_key"] for seen in api.seen]
    assert len(set(keys)) == 6
    assert all(str(uuid.UUID(k)) == k for k in keys)
    assert keys[0][:24] != keys[1][:24]  # each client draws its own random part


def test_a_connection_the_server_closed_while_idle_is_not_used(
        api: ThreadingHTTPServer) -> None:
    api.script = [(200, {THEN_CLOSE: "1"}, {"id": "x", "status": "dead"}),
                  (200, {}, {"id": "x", "status": "queued"})]
    with Client(_url(api), attempts=1) as client:
        client.get("x")
        # Once the server's close has reached the pooled connection (as it has long before a
        # kept-alive connection's next use, in practice):
        wait_for(lambda: all(conn.dropped for conn in client._pool._idle),
                 message="the server's close to arrive")
        # A requeue is never replayed: it must go out on a live connection the first time.
        assert client.retry("x") == {"id": "x", "status": "queued"}
    assert len(api.seen) == 2 and api.seen[0]["port"] != api.seen[1]["port"]


def test_a_keyed_batch_is_retried_with_its_keys(api: ThreadingHTTPServer) -> None:
    api.script = [UNAVAILABLE, (201, {}, {"jobs": []})]
    waits: list[float] = []
    with Client(_url(api), sleep=waits.append) as client:
        client.enqueue_batch([{"type": "echo"}, {"type": "echo", "idempotency_key": "k"}])
    first, second = (seen["body"]["jobs"] for seen in api.seen)
    assert first == second and waits == [7.0]
    assert first[1]["idempotency_key"] == "k" and uuid.UUID(first[0]["idempotency_key"])


def test_an_unkeyed_batch_carries_no_keys_and_is_never_retried(
        api: ThreadingHTTPServer) -> None:
    api.script = [UNAVAILABLE]
    with Client(_url(api), sleep=lambda _s: None) as client, \
            pytest.raises(ClientError) as info:
        client.enqueue_batch([{"type": "echo"}, {"type": "echo", "idempotency_key": "k"}],
                             keyed=False)
    assert info.value.status == 503 and len(api.seen) == 1
    assert api.seen[0]["body"]["jobs"] == [{"type": "echo"},
                                           {"type": "echo", "idempotency_key": "k"}]


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_async_client_retries_a_503_with_one_key(api: ThreadingHTTPServer) -> None:
    api.script = [UNAVAILABLE, CREATED]
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    async def main() -> Any:
        async with AsyncClient(_url(api), sleep=sleep, token="s3cret") as client:
            job = await client.enqueue("echo", {"a": 1})
            listed = await client.list(status="dead", limit=5)
            return job, listed

    job, _listed = _run(main())
    assert job == {"id": "x", "status": "queued"} and waits == [7.0]
    first, second, listing = api.seen
    assert first["body"] == second["body"] and str(uuid.UUID(
        first["body"]["idempotency_key"])) == first["body"]["idempotency_key"]
    assert listing["path"] == "/api/v1/jobs?status=dead&limit=5"
    assert {s["headers"]["Authorization"] for s in api.seen} == {"Bearer s3cret"}
    assert len({s["port"] for s in api.seen}) == 1  # one kept-alive connection


def test_async_client_raises_the_error_shape_and_does_not_replay_a_requeue(
        api: ThreadingHTTPServer) -> None:
    async def main() -> tuple[ClientError, ClientError]:
        async with AsyncClient(_url(api), attempts=3) as client:
            api.script = [(422, {}, {"error": {"code": "validation_failed", "message": "bad",
                                               "details": [{"field": "type"}]}})]
            with pytest.raises(ClientError) as invalid:
                await client.enqueue("")
            api.script = [("drop", {}, None), (200, {}, {"id": "x"})]
            with pytest.raises(ClientError) as lost:
                await client.retry("x")
            return invalid.value, lost.value

    invalid, lost = _run(main())
    assert (invalid.status, invalid.code, invalid.details) == (
        422, "validation_failed", [{"field": "type"}])
    assert lost.code == "connection_lost"
    assert len(api.seen) == 2  # the refused enqueue once, the dropped requeue once


def test_async_client_unreachable_is_retried_then_reported(unused_port: int) -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    async def main() -> None:
        async with AsyncClient(f"http://127.0.0.1:{unused_port}", attempts=3,
                               sleep=sleep) as client:
            await client.get("x")

    with pytest.raises(ClientError) as info:
        _run(main())
    assert (info.value.status, info.value.code) == (0, "unreachable") and waits == [0.2, 0.4]


def test_async_client_serves_concurrent_tasks(api: ThreadingHTTPServer) -> None:
    api.script = [CREATED]
    many = 20

    async def main() -> list[Any]:
        async with AsyncClient(_url(api), pool_size=4) as client:
            return await asyncio.gather(*(client.enqueue("echo") for _ in range(many)))

    assert len(_run(main())) == many
    assert len({s["body"]["idempotency_key"] for s in api.seen}) == many


def _child_key(client: Client, out: Any) -> None:
    out.put((client.new_key(), client.enqueue("echo")["id"]))


def test_a_forked_child_makes_its_own_keys_and_connections(api: ThreadingHTTPServer) -> None:
    api.script = [CREATED]
    ctx = multiprocessing.get_context("fork")
    with Client(_url(api)) as client:
        client.enqueue("echo")  # a pooled connection the child must not write to
        out = ctx.Queue()
        child = ctx.Process(target=_child_key, args=(client, out))
        child.start()
        child_key, _ = out.get(timeout=10)
        child.join(10)
        parent_key = client.new_key()
        client.enqueue("echo")
    assert child.exitcode == 0
    assert child_key[:24] != parent_key[:24]
    ports = [seen["port"] for seen in api.seen]
    assert ports[0] == ports[2] != ports[1]  # the parent kept its connection, the child its own
