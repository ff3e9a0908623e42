"""The declared types through a real `taskline api`: `Client.types()`, `AsyncClient.types()`
and `taskline types` (table and --json) show what workers declared; under
TASKLINE_UNKNOWN_TYPES=reject the client's enqueue of an undeclared type fails naming `type`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from taskline.client import AsyncClient, Client, ClientError
from taskline.handlers.payloads import PayloadModel
from taskline.settings import Settings
from taskline.store.store import Store
from tests.integration.test_cli_client import taskline
from tests.integration.test_client_api import start_api
from tests.integration.typed_payloads import Ping, ReceiptV1, ReceiptV2

pytestmark = pytest.mark.slow


def declare(store: Store) -> None:
    """Two workers of two releases, as each records itself at start."""
    ping = {"type": "typed.ping", "queue": "default", "schema": PayloadModel(Ping).schema}
    for worker, receipt, more in (("w-1", ReceiptV1, []), ("w-2", ReceiptV2, [ping])):
        store.upsert_worker(worker, "host", 1, ["receipts"], 1)
        store.declare_types(worker, [
            {"type": "typed.receipt", "queue": "receipts",
             "schema": PayloadModel(receipt).schema},
            {"type": "echo", "queue": "default", "schema": None}, *more], 86_400)


def test_the_clients_list_types_and_reject_mode_names_the_type(settings: Settings,
                                                                store: Store,
                                                                tmp_path: Path) -> None:
    declare(store)
    for url in start_api(settings, tmp_path / "logs", TASKLINE_UNKNOWN_TYPES="reject"):
        with Client(url, attempts=1) as client:
            listed = {t["type"]: t for t in client.types()["types"]}
            assert sorted(listed) == ["echo", "typed.ping", "typed.receipt"]
            assert listed["typed.ping"]["workers"] == ["w-2"]
            assert listed["typed.receipt"]["workers"] == ["w-1", "w-2"]
            with pytest.raises(ClientError) as caught:
                client.enqueue("typed.pnig", {"host": "a"})
            assert caught.value.status == 422 and caught.value.code == "validation_failed"
            assert caught.value.details[0]["field"] == "type"
            assert client.enqueue("typed.ping", {"host": "a"})["type"] == "typed.ping"

        assert asyncio.run(async_types(url))["types"][0]["type"] == "echo"


async def async_types(url: str) -> dict[str, Any]:
    async with AsyncClient(url, attempts=1) as client:
        return await client.types()


def test_taskline_types_prints_fields_versions_and_workers(settings: Settings, store: Store,
                                                           tmp_path: Path) -> None:
    store.upsert_worker("w-1", "host", 1, ["receipts"], 1)
    store.declare_types("w-1", [
        {"type": "typed.receipt", "queue": "receipts", "schema": PayloadModel(ReceiptV2).schema},
        {"type": "echo", "queue": "default", "schema": None}], 86_400)
    store.upsert_worker("w-2", "host", 1, ["receipts"], 1)
    store.declare_types("w-2", [
        {"type": "typed.receipt", "queue": "receipts",
         "schema": PayloadModel(ReceiptV1).schema}], 86_400)
    for url in start_api(settings, tmp_path / "logs"):
        shown = taskline("types", url=url)
        assert shown.returncode == 0, shown.stderr
        header, *rows = [line.split() for line in shown.stdout.splitlines()]
        assert header[:5] == ["TYPE", "QUEUE", "FIELDS", "VERSIONS", "WORKERS"]
        assert rows[0][:3] == ["echo", "default", "any"]
        receipt = rows[1]
        assert receipt[0] == "typed.receipt" and receipt[3:5] == ["2", "2"]
        # The newest version's fields (jsonb keeps an object's keys in its own order).
        assert receipt[2] in ("order*", "copies,order_id*")
        as_json = json.loads(taskline("types", "--json", url=url).stdout)
        assert len(as_json["types"][1]["schemas"]) == 2
