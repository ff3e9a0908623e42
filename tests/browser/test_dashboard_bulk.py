"""The dashboard's bulk dead-letter buttons and its schedules section, in a real browser.

Invariant checked: "Requeue matching" and "Purge matching" act only after the operator
confirms in a dialog (Cancel changes nothing), and answer how many jobs were done and how many
still match; the schedules section lists each schedule with its next run and state, and marks
one the code declared and no longer does.
"""

from __future__ import annotations

import json
import re
import urllib.request

import pytest
from playwright.sync_api import Page, expect

from tests.browser.test_dashboard import (  # noqa: F401 (the api_port and page fixtures)
    TOKEN,
    api_port,
    flood,
    page,
    sign_in,
)
from tests.helpers import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def call(port: int, method: str, path: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/v1{path}", method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def put_schedule(port: int, name: str, body: dict) -> dict:
    return call(port, "PUT", f"/schedules/{name}", body)


def all_dead_again(port: int, n: int) -> bool:
    counts = [q["counts"] for q in call(port, "GET", "/queues")["queues"]]
    return sum(c["dead"] for c in counts) == n and not any(
        c["queued"] or c["running"] or c["retrying"] for c in counts)


def confirm(page: Page, button: str, answer: str) -> None:  # noqa: F811
    page.click(button)
    dialog = page.locator("#bulk-dialog")
    expect(dialog).to_be_visible()
    page.click("#bulk-confirm" if answer == "confirm" else "#bulk-cancel")
    expect(dialog).to_be_hidden()


def test_bulk_requeue_and_purge_ask_first_and_schedules_are_listed(
        api_port: int, page: Page) -> None:  # noqa: F811
    put_schedule(api_port, "nightly.report", {"cron": "0 3 * * *", "timezone": "Europe/Berlin",
                                              "job": {"type": "echo"}})
    put_schedule(api_port, "paused.one", {"cron": "*/5 * * * *", "paused": True,
                                          "job": {"type": "echo"}})
    sign_in(page, api_port)
    rows = page.locator("#schedules-body tr[data-schedule]")
    expect(rows).to_have_count(2)
    expect(rows.nth(0)).to_contain_text("0 3 * * * (Europe/Berlin)")
    expect(rows.nth(0)).to_contain_text("active")
    expect(rows.nth(1)).to_contain_text("paused")
    expect(rows.nth(0)).not_to_contain_text("no longer in code")


def test_a_schedule_no_longer_declared_in_code_is_marked(api_port: int, page: Page,  # noqa: F811
                                                        store) -> None:
    put_schedule(api_port, "old.report", {"cron": "0 3 * * *", "job": {"type": "echo"}})
    store.mark_declared_schedules(["old.report"])  # a maintenance start whose code declares it
    store.mark_declared_schedules([])  # then one whose code no longer does
    sign_in(page, api_port)
    row = page.locator("#schedules-body tr[data-schedule='old.report']")
    expect(row).to_contain_text("active · no longer in code")

    flood(page, 4, failure_pct=100, duration_ms=0)
    expect(page.locator("#count-dead")).to_have_text("4")
    page.click("#bulk-purge")  # no filter yet: nothing is asked, nothing is done
    expect(page.locator("#bulk-status")).to_have_text("Give a queue or a type first.")

    page.fill("#bulk-type", "simulate")
    confirm(page, "#bulk-purge", "cancel")
    expect(page.locator("#count-dead")).to_have_text("4")

    page.fill("#bulk-queue", "default")
    confirm(page, "#bulk-requeue", "confirm")
    expect(page.locator("#bulk-status")).to_have_text(
        re.compile(r"^4 requeued, \d still matching\.$"))
    # Failing every time, they die again; then a purge deletes them for good.
    wait_for(lambda: all_dead_again(api_port, 4), timeout=20, message="four dead jobs again")
    confirm(page, "#bulk-purge", "confirm")
    expect(page.locator("#bulk-status")).to_have_text("4 purged, 0 still matching.")
    expect(page.locator("#count-dead")).to_have_text("0")
    expect(page.locator("#dead-body")).to_contain_text("No dead job.")
