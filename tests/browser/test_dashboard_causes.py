"""The dashboard's dead jobs by cause, in a real browser.

Invariant checked: dead jobs of one cause show as one row with their count, types and queues;
its Requeue and Purge buttons act on that cause's jobs only after the operator confirms.
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from tests.browser.test_dashboard import (  # noqa: F401 (the api_port and page fixtures)
    api_port,
    flood,
    page,
    sign_in,
)
from tests.browser.test_dashboard_bulk import all_dead_again, call, confirm
from tests.helpers import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def test_a_cause_is_one_row_with_its_requeue_and_purge(
        api_port: int, page: Page) -> None:  # noqa: F811
    sign_in(page, api_port)
    flood(page, 3, failure_pct=100, duration_ms=0)
    expect(page.locator("#count-dead")).to_have_text("3")
    rows = page.locator("#causes-body tr[data-fingerprint]")
    expect(rows).to_have_count(1)
    (group,) = call(api_port, "GET", "/dlq/groups")["groups"]
    expect(rows.nth(0)).to_have_attribute("data-fingerprint", group["fingerprint"])
    expect(rows.nth(0)).to_contain_text("simulate")
    expect(rows.nth(0).locator("td").nth(1)).to_have_text("3")

    confirm(page, "#causes-body button:text-is('Purge')", "cancel")
    expect(page.locator("#count-dead")).to_have_text("3")
    confirm(page, "#causes-body button:text-is('Requeue')", "confirm")
    expect(page.locator("#bulk-status")).to_have_text(
        re.compile(r"^3 requeued, \d still matching\.$"))
    wait_for(lambda: all_dead_again(api_port, 3), timeout=20, message="three dead jobs again")
    confirm(page, "#causes-body button:text-is('Purge')", "confirm")
    expect(page.locator("#bulk-status")).to_have_text("3 purged, 0 still matching.")
    expect(page.locator("#causes-body")).to_contain_text("No dead job.")
