"""Release 1 of a declared job type, as one release of an application's worker declares it:
`typed.receipt` carries `{"order": int}` (typed_payloads.ReceiptV1). Release 2
(typed_handlers_v2) renames the field, so tests run both releases' workers side by side as a
rolling deploy does. Never imported beside typed_handlers_v2: one process, one release."""

from __future__ import annotations

from typing import Any

from taskline.handlers.registry import JobContext, handler
from tests.integration.typed_payloads import ReceiptV1


@handler("typed.receipt", payload=ReceiptV1, queue="receipts")
def send_receipt(payload: ReceiptV1, ctx: JobContext) -> dict[str, Any]:
    # The class name proves the handler received the validated instance, not the JSON.
    return {"class": type(payload).__name__, "order": payload.order}
