"""Unique jobs and debounce through `Client`, `AsyncClient` and `taskline enqueue` against a
real API subprocess. The tests share one database and one API (tests/integration/conftest.py),
so each uses keys of its own."""

from __future__ import annotations

import asyncio
import json

import pytest

from taskline.client import AsyncClient, Client, ClientError
from tests.integration.test_cli_client import taskline


@pytest.fixture
def api_url(module_api_url: str, redis_url: str) -> str:
    return module_api_url


def test_client_unique_and_debounce(api_url: str) -> None:
    with Client(api_url) as client:
        first = client.enqueue("echo", {"n": 1}, unique={"key": "c"})
        again = client.enqueue("echo", {"n": 2}, unique={"key": "c"})
        assert again["id"] == first["id"] and again["duplicate"] is True
        joined = [client.enqueue("echo", n, debounce={"key": "d", "delay_s": 30})
                  for n in range(3)]
        assert {j["id"] for j in joined} == {joined[0]["id"]}
        assert [j.get("debounced", False) for j in joined] == [False, True, True]
        assert client.get(joined[0]["id"])["debounce"] == {"key": "d", "joined": 3}
        batch = client.enqueue_batch([{"type": "echo", "unique": {"key": "c"}},
                                      {"type": "echo", "debounce": {"key": "d", "delay_s": 30}}])
        assert [j["created"] for j in batch["jobs"]] == [False, False]
        assert batch["jobs"][0]["job"]["id"] == first["id"]
        with pytest.raises(ClientError) as refused:
            client.enqueue("echo", unique={"states": ["nope"]})
        assert refused.value.status == 422
        assert refused.value.details[0]["field"] == "unique.states[0]"


def test_async_client_unique_and_debounce(api_url: str) -> None:
    async def body() -> tuple:
        async with AsyncClient(api_url) as client:
            a = await client.enqueue("echo", 1, unique={"key": "x", "on_conflict": "replace"})
            b = await client.enqueue("echo", 2, unique={"key": "x", "on_conflict": "replace"})
            c = await client.enqueue("echo", 1, debounce={"key": "y", "delay_s": 30})
            d = await client.enqueue("echo", 2, debounce={"key": "y", "delay_s": 30})
            return a, b, c, d

    a, b, c, d = asyncio.run(body())
    assert b["id"] == a["id"] and b["replaced"] is True and b["payload"] == 2
    assert d["id"] == c["id"] and d["debounced"] is True


def test_cli_unique_and_debounce(api_url: str) -> None:
    first = taskline("enqueue", "echo", "--payload", '{"n": 1}', "--unique-key", "k",
                     "--json", url=api_url)
    assert first.returncode == 0, first.stderr
    again = taskline("enqueue", "echo", "--payload", '{"n": 2}', "--unique-key", "k",
                     url=api_url)
    assert again.returncode == 0, again.stderr
    job_id, _status, flag = again.stdout.split()
    assert job_id == json.loads(first.stdout)["id"] and flag == "duplicate"
    by_payload = [taskline("enqueue", "echo", "--payload", '{"same": 1}', "--unique",
                           "--unique-states", "queued,scheduled", "--json", url=api_url)
                  for _ in range(2)]
    ids = {json.loads(done.stdout)["id"] for done in by_payload}
    assert len(ids) == 1
    joins = [taskline("enqueue", "echo", "--payload", str(n), "--debounce-key", "g",
                      "--debounce-delay", "30", url=api_url) for n in range(2)]
    assert joins[1].stdout.split()[2] == "debounced"
    status = taskline("status", joins[0].stdout.split()[0], url=api_url)
    assert "debounce" in status.stdout and '"joined":2' in status.stdout.replace(" ", "")
    assert "joined" in status.stdout.split("\n\n")[1]  # the event table
    bad = taskline("enqueue", "echo", "--unique-period", "-3", url=api_url)
    assert bad.returncode != 0 and "unique.period_s" in bad.stderr


def test_cli_schedule_with_a_unique_job(api_url: str) -> None:
    made = taskline("schedules", "set", "nightly", "0 3 * * *", "echo", "--unique-key", "n",
                    "--unique-states", "queued,running", "--json", url=api_url)
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["job"]["unique"]["states"] == ["queued", "running"]
