"""Release 2 of `typed.receipt` (see typed_handlers_v1): a dataclass whose order is `order_id`,
a string; and `typed.ping`, declared by a TypedDict, so each payload kind runs in a worker."""

from __future__ import annotations

from typing import Any

from taskline.handlers.registry import JobContext, handler
from tests.integration.typed_payloads import Ping, ReceiptV2


@handler("typed.receipt", payload=ReceiptV2, queue="receipts", priority="high")
def send_receipt(payload: ReceiptV2, ctx: JobContext) -> dict[str, Any]:
    return {"class": type(payload).__name__, "order_id": payload.order_id,
            "copies": payload.copies}


@handler("typed.ping", payload=Ping)
def ping(payload: Ping, ctx: JobContext) -> str:
    return payload["host"]
