"""The dashboard's job view shows a debounced job's key and joined payloads, its `joined`
events, and a unique job's key (Chromium against a real API, worker and maintenance)."""

from __future__ import annotations

import json
import urllib.request

import pytest
from playwright.sync_api import Page, expect

from tests.browser.test_dashboard import TOKEN, api_port, page, sign_in  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def _enqueue(port: int, body: dict) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/v1/jobs", data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


def _open(page: Page, job_id: str) -> None:  # noqa: F811
    page.fill("#search-input", job_id)
    page.keyboard.press("Enter")
    expect(page.locator("#history")).to_contain_text(job_id)


def test_job_view_shows_debounce_and_unique(api_port: int, page: Page) -> None:  # noqa: F811
    debounced = [_enqueue(api_port, {"type": "echo", "payload": n,
                                     "debounce": {"key": "digest", "delay_s": 600}})
                 for n in range(3)]
    unique = _enqueue(api_port, {"type": "echo", "delay_s": 600, "unique": {"key": "nightly"}})
    sign_in(page, api_port)
    _open(page, debounced[0]["id"])
    history = page.locator("#history")
    expect(history).to_contain_text("digest (3 payloads)")
    expect(history.locator('tr[data-event="joined"]')).to_have_count(2)
    expect(history.locator('tr[data-event="joined"]').last).to_contain_text("3 payloads")
    _open(page, unique["id"])
    expect(history).to_contain_text("Unique key")
    expect(history).to_contain_text("nightly")
