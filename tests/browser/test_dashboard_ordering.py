"""The dashboard's job view shows a job's ordering key (where an operator looks for why a queued
job has not started: the job ahead of it in its key's line still runs) and its tags, and its
search finds jobs by tag (`tag:name`)."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from taskline.client import Client
from tests.browser.test_dashboard import TOKEN, api_port, page, sign_in  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def test_the_job_view_shows_the_ordering_key(api_port: int, page: Page) -> None:  # noqa: F811
    sign_in(page, api_port)
    with Client(f"http://127.0.0.1:{api_port}", token=TOKEN) as client:
        job = client.enqueue("simulate", {"sleep_s": 0}, ordering_key="account-42",
                             start_within_s=3600)
    page.fill("#search-input", job["id"])
    page.keyboard.press("Enter")
    history = page.locator("#history")
    expect(history).to_contain_text(job["id"])
    expect(history).to_contain_text("Ordering key")
    expect(history).to_contain_text("account-42")
    expect(history).to_contain_text("Expires")


def test_the_search_finds_jobs_by_tag_and_opens_one(api_port: int, page: Page) -> None:  # noqa: F811
    sign_in(page, api_port)
    with Client(f"http://127.0.0.1:{api_port}", token=TOKEN) as client:
        tagged = [client.enqueue("simulate", {"sleep_s": 0}, tags=["acct-9"])["id"]
                  for _ in range(2)]
        client.enqueue("simulate", {"sleep_s": 0}, tags=["other"])
    page.fill("#search-input", "tag:acct-9")
    page.keyboard.press("Enter")
    found = page.locator("#history li[data-job]")
    expect(found).to_have_count(2)
    assert sorted(found.evaluate_all("rows => rows.map(r => r.dataset.job)")) == sorted(tagged)
    found.first.get_by_role("button").click()
    expect(page.locator("#history")).to_contain_text("Tags")
    expect(page.locator("#history")).to_contain_text("acct-9")
