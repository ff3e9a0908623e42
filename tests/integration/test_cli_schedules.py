"""`taskline schedules list|set|delete` and `taskline dlq retry|purge` with filters, and the
client methods behind them, against a real `taskline api` subprocess. The tests share one
database and one API (tests/integration/conftest.py); each deletes the schedules it made."""

from __future__ import annotations

import json

import pytest

from taskline.client import Client, ClientError
from taskline.settings import Settings
from tests.integration.test_cli_client import taskline
from tests.integration.test_client_api import make_dead


@pytest.fixture
def settings(module_settings: Settings, redis_url: str) -> Settings:
    return module_settings


@pytest.fixture
def api_url(module_api_url: str, redis_url: str) -> str:
    return module_api_url


def test_schedules_set_list_delete(api_url: str) -> None:
    made = taskline("schedules", "set", "nightly", "0 3 * * *", "report", "--payload",
                    '{"a": 1}', "--queue", "reports", "--timezone", "Europe/Berlin",
                    "--catch-up", "none", "--json", url=api_url)
    assert made.returncode == 0, made.stderr
    schedule = json.loads(made.stdout)
    assert (schedule["name"], schedule["timezone"], schedule["catch_up"]) == (
        "nightly", "Europe/Berlin", "none")
    assert schedule["job"]["payload"] == {"a": 1} and len(schedule["next_runs"]) == 5
    listed = taskline("schedules", "list", url=api_url)
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()[:2]
    assert header.split()[:3] == ["NAME", "CRON", "TIMEZONE"]
    assert row.split()[0] == "nightly" and schedule["next_runs"][0] in row
    bad = taskline("schedules", "set", "nightly", "0 3 * *", "report", url=api_url)
    assert bad.returncode == 1 and "cron" in bad.stderr
    gone = taskline("schedules", "delete", "nightly", url=api_url)
    assert gone.returncode == 0 and "deleted" in gone.stdout
    again = taskline("schedules", "delete", "nightly", url=api_url)
    assert again.returncode == 1 and "404" in again.stderr


def test_dlq_retry_and_purge_with_filters(api_url: str, store, dispatcher) -> None:
    ids = [make_dead(store, dispatcher, queue="q1") for _ in range(3)]
    other = make_dead(store, dispatcher, queue="q2")
    one = taskline("dlq", "retry", ids[0], url=api_url)  # a single job, as before
    assert one.returncode == 0 and one.stdout.split() == [ids[0], "queued"]
    bulk = taskline("dlq", "retry", "--queue", "q1", "--limit", "1", url=api_url)
    assert bulk.returncode == 0, bulk.stderr
    assert bulk.stdout.split() == ["requeued", "1", "remaining", "1"]
    purged = taskline("dlq", "purge", "--id", other, "--json", url=api_url)
    assert json.loads(purged.stdout) == {"purged": 1, "remaining": 0}
    empty = taskline("dlq", "purge", url=api_url)
    assert empty.returncode == 2 and "--queue" in empty.stderr
    with Client(api_url) as client:
        assert client.retry_dead(queue="q1") == {"requeued": 1, "remaining": 0}
        assert client.purge_dead(ids=ids) == {"purged": 0, "remaining": 0}
        with pytest.raises(ClientError) as refused:
            client.retry_dead(queue="bad queue")
        assert refused.value.status == 422


def test_client_schedule_methods(api_url: str) -> None:
    with Client(api_url) as client:
        made = client.set_schedule("every.minute", "* * * * *", {"type": "echo"})
        assert made["cron"] == "* * * * *" and made["job"]["queue"] == "default"
        assert client.schedule("every.minute")["name"] == "every.minute"
        assert [s["name"] for s in client.schedules()["schedules"]] == ["every.minute"]
        assert client.set_schedule("every.minute", "* * * * *", {"type": "echo"},
                                   paused=True)["next_runs"] == []
        assert client.delete_schedule("every.minute")["deleted"] is True
        with pytest.raises(ClientError) as missing:
            client.schedule("every.minute")
        assert missing.value.status == 404
