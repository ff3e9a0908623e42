"""The dashboard's job view shows a job's ordering key, where an operator looks for why a
queued job has not started (the job ahead of it in its key's line still runs)."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from taskline.client import Client
from tests.browser.test_dashboard import TOKEN, api_port, page, sign_in  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def test_the_job_view_shows_the_ordering_key(api_port: int, page: Page) -> None:  # noqa: F811
    sign_in(page, api_port)
    with Client(f"http://127.0.0.1:{api_port}", token=TOKEN) as client:
        job = client.enqueue("simulate", {"sleep_s": 0}, ordering_key="account-42")
    page.fill("#search-input", job["id"])
    page.keyboard.press("Enter")
    history = page.locator("#history")
    expect(history).to_contain_text(job["id"])
    expect(history).to_contain_text("Ordering key")
    expect(history).to_contain_text("account-42")
