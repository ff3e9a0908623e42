"""The library's enqueue examples of README.md and docs/client.md, extracted and run as written
against the test database (real PostgreSQL).

Each ```python block that calls `taskline.enqueue` / `aenqueue` / `submit_workflow` is run with
only what the prose around it assumes (an `engine`, an `orders` table, an `order_id`; the
waiting example's job is run by taskline.testing.drain) and the
placeholder database URLs replaced by the test database's; what it wrote is then read back.
The set of blocks is pinned, so an example added or removed without a test here fails. The
Django example is the one not run: Django is no dependency of taskline's.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, Engine, Integer, MetaData, Table, create_engine, text

from taskline.store.store import Store, sqlalchemy_url
from taskline.testing import drain
from tests.helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
LIBRARY_CALL = re.compile(r"taskline\.a?(enqueue|submit_workflow)")
PLACEHOLDER_URL = re.compile(r"postgresql\+psycopg(_async)?://app@db/\w+")


def library_examples(doc: str) -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / doc).read_text(), re.S)
    return [b for b in blocks if LIBRARY_CALL.search(b)]


def runnable(block: str, database_url: str) -> str:
    """`block` with its placeholder URLs pointing at the test database, driver kept."""
    sync = sqlalchemy_url(database_url)
    return PLACEHOLDER_URL.sub(
        lambda m: sync.replace("+psycopg://", "+psycopg_async://") if m.group(1) else sync,
        block)


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    eng = create_engine(sqlalchemy_url(database_url))
    yield eng
    eng.dispose()


@pytest.fixture
def orders(engine: Engine) -> Table:
    table = Table("orders", MetaData(), Column("id", Integer, primary_key=True),
                  Column("total", Integer))
    table.metadata.create_all(engine)
    return table


def jobs_of(store: Store, job_type: str) -> list[Any]:
    with store.transaction() as conn:
        return conn.execute(text("SELECT payload, idempotency_key FROM taskline.jobs"
                                 " WHERE type = :t"), {"t": job_type}).all()


def test_the_examples_are_the_ones_run_here() -> None:
    assert [b.splitlines()[0] for b in library_examples("README.md")] == ["import taskline"]
    assert [b.splitlines()[0] for b in library_examples("docs/client.md")] == [
        "import taskline", "import taskline", "from flask import Flask",
        "from django.db import connection, transaction", "import taskline"]


def watched(engine: Engine, job_id: Any) -> bool:
    """Whether a waiter flagged the committed job `job_id` (jobs.watched)."""
    with engine.connect() as conn:
        return bool(conn.execute(text("SELECT watched FROM taskline.jobs WHERE id = :id"),
                                 {"id": job_id}).scalar())


def test_waiting_example_returns_the_result_once_a_worker_ran_it(engine: Engine,
                                                                 database_url: str) -> None:
    namespace: dict[str, Any] = {"engine": engine}
    block = library_examples("docs/client.md")[4]
    waiter = threading.Thread(target=exec, args=(block, namespace), daemon=True)
    waiter.start()
    # The example names its job inside the enqueue's transaction: the flag `taskline.wait` sets
    # before its first read says the enqueue committed and the wait began.
    wait_for(lambda: "job_id" in namespace and watched(engine, namespace["job_id"]),
             message="the example to enqueue and wait")
    assert waiter.is_alive()  # waiting: nothing ran the job yet
    assert drain(database_url).succeeded == 1
    waiter.join(30)
    assert namespace["report"]["rows"] == 1000


@pytest.mark.parametrize("doc", ["README.md", "docs/client.md"])
def test_enqueue_in_a_sqlalchemy_transaction(doc: str, engine: Engine, orders: Table,
                                             store: Store) -> None:
    exec(library_examples(doc)[0], {"engine": engine, "orders": orders, "order_id": 7,
                                    "total": 42})
    assert jobs_of(store, "send_receipt") == [({"order": 7}, None)]
    with engine.connect() as conn:
        assert conn.execute(orders.select()).all() == [(7, 42)]


def test_asyncio_example(database_url: str, orders: Table, store: Store) -> None:
    namespace: dict[str, Any] = {"orders": orders}
    exec(runnable(library_examples("docs/client.md")[1], database_url), namespace)

    async def place_and_dispose() -> None:
        await namespace["place_order"](9)
        await namespace["engine"].dispose()
    asyncio.run(place_and_dispose())
    assert jobs_of(store, "send_receipt") == [({"order": 9}, None)]
    assert [p for p, _ in jobs_of(store, "pack")] == [{"order": 9}]
    assert len(jobs_of(store, "post")) == 1


def test_flask_sqlalchemy_example(database_url: str, store: Store) -> None:
    namespace: dict[str, Any] = {"__name__": "shop"}
    exec(runnable(library_examples("docs/client.md")[2], database_url), namespace)
    app, db = namespace["app"], namespace["db"]
    with app.app_context():
        db.create_all()
    try:
        response = app.test_client().post("/orders")
        assert response.status_code == 201
        order_id = response.get_json()["id"]
        assert jobs_of(store, "send_receipt") == [({"order": order_id}, f"receipt:{order_id}")]
    finally:
        with app.app_context():
            db.engine.dispose()
