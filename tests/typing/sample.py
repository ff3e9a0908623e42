"""A program using taskline's public API as an application would, checked by `mypy --strict`
in `make lint` (tests/unit/test_typing.py also shows the check fails on a misspelt keyword).
It is type-checked, never run."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
from pydantic import BaseModel
from sqlalchemy import Connection
from typing_extensions import TypedDict

import taskline
from taskline import (
    AsyncClient,
    Client,
    Handler,
    InvalidJob,
    JobContext,
    JobRequest,
    NonRetryableError,
    RetryableError,
    handler,
    periodic,
)


class Receipt(BaseModel):
    order: int
    email: str


@dataclass
class Resize:
    image: str
    width: int = 640


class Ping(TypedDict):
    host: str


@handler("send_receipt", payload=Receipt, queue="receipts", priority="high", max_retries=5)
def send_receipt(payload: Receipt, ctx: JobContext) -> dict[str, int]:
    if ctx.stopping:
        raise RetryableError("stopping", delay_s=1.0)
    ctx.on_complete(lambda conn: None)
    return {"order": payload.order, "attempt": ctx.attempt}


@handler("fetch_receipt", payload=Receipt, timeout_s=10.0)
async def fetch_receipt(payload: Receipt, ctx: JobContext) -> dict[str, int]:
    await asyncio.sleep(0)
    return {"order": payload.order}


@handler("resize", payload=Resize, timeout_s=30.0)
def resize(payload: Resize, ctx: JobContext) -> None:
    if payload.width <= 0:
        raise NonRetryableError("width must be positive")


@handler("ping", payload=Ping)
def ping(payload: Ping, ctx: JobContext) -> str:
    return payload["host"]


@periodic("nightly", cron="0 3 * * *", job={"type": "report"})
@handler("report")
def report(payload: Any, ctx: JobContext) -> None:
    return None


nightly: Handler[Any, None] = report  # @periodic returns what it decorates


def typed_handlers(conn: Connection) -> list[uuid.UUID]:
    receipt_handler: Handler[Receipt, dict[str, int]] = send_receipt
    first = receipt_handler.enqueue(conn, Receipt(order=1, email="a@example.com"))
    second = resize.enqueue(conn, Resize(image="a.png"), delay_s=5.0, idempotency_key="r-1")
    third = ping.enqueue(conn, {"host": "db1"}, queue="pings")
    result: dict[str, int] = send_receipt(Receipt(order=2, email="b@example.com"),
                                          JobContext(job_id=uuid.uuid4(), attempt=1,
                                                     queue="receipts", type="send_receipt",
                                                     worker_id="w"))
    assert result["order"] == 2
    return [first, second, third]


def plain_enqueue(conn: Connection, pg: psycopg.Connection[Any]) -> list[uuid.UUID]:
    one = taskline.enqueue(conn, "send_email", {"to": "a@example.com"}, queue="mail",
                           priority=7, max_retries=3, timeout_s=10.0, run_at="2030-01-01T00:00:00Z",
                           limit_key="tenant-1")
    jobs: list[JobRequest] = [{"type": "echo", "payload": [1, 2]},
                              {"type": "echo", "priority": "low", "delay_s": 1.5}]
    try:
        more = taskline.enqueue_many(pg, jobs)
    except InvalidJob as err:
        print(err.errors)
        more = []
    workflow = taskline.submit_workflow(conn, "w", [{"id": "a", "job": {"type": "echo"}}])
    return [one, *more, workflow]


async def async_enqueue(conn: psycopg.AsyncConnection[Any]) -> uuid.UUID:
    await send_receipt.aenqueue(conn, Receipt(order=3, email="c@example.com"))
    await taskline.aenqueue_many(conn, [{"type": "echo"}])
    return await taskline.aenqueue(conn, "echo", {"x": 1}, priority="critical")


def client_calls() -> None:
    with Client("http://127.0.0.1:8000", token="t") as client:
        job: dict[str, Any] = client.enqueue("echo", {"x": 1}, queue="default")
        client.types()
        client.workers()
        client.get(job["id"])


async def async_client_calls() -> None:
    async with AsyncClient("http://127.0.0.1:8000") as client:
        declared: dict[str, Any] = await client.types()
        job = await client.enqueue("echo", {"x": 1}, priority="high")
        await client.get(job["id"])
        await client.workers()
        done: dict[str, Any] = await client.wait(job["id"], timeout=5.0)
        print(declared["types"], done["status"])


if __name__ == "__main__":
    asyncio.run(async_client_calls())
