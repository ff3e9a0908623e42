"""The dashboard's declared job types, in a real browser.

Invariant checked: each type the workers declared is one row with its queue, the newest
version's payload fields (required ones starred), how many versions and workers declare it;
the built-ins the real worker serves show "any" payload.
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from taskline.handlers.payloads import PayloadModel
from taskline.store.store import Store
from tests.browser.test_dashboard import (  # noqa: F401 (the api_port and page fixtures)
    api_port,
    page,
    sign_in,
)
from tests.integration.typed_payloads import ReceiptV1, ReceiptV2

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def test_declared_types_show_fields_versions_and_workers(
        api_port: int, page: Page, store: Store) -> None:  # noqa: F811
    for worker, model in (("w-old", ReceiptV1), ("w-new", ReceiptV2)):
        store.upsert_worker(worker, "host", 1, ["receipts"], 1)
        store.declare_types(worker, [{"type": "typed.receipt", "queue": "receipts",
                                      "schema": PayloadModel(model).schema}], 86_400)
    sign_in(page, api_port)
    row = page.locator('#types-body tr[data-type="typed.receipt"]')
    expect(row).to_have_count(1)
    cells = row.locator("td")
    expect(cells.nth(1)).to_have_text("receipts")
    # The newest version's fields (either release may have beaten the other; PostgreSQL's
    # jsonb keeps an object's keys in its own order).
    expect(cells.nth(2)).to_have_text(re.compile(r"^(copies, order_id\*|order\*)$"))
    expect(cells.nth(3)).to_have_text("2")
    expect(cells.nth(4)).to_have_text("2")
    echo = page.locator('#types-body tr[data-type="echo"] td')
    expect(echo.nth(2)).to_have_text("any")
