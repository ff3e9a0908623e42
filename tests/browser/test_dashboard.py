"""The dashboard in a real browser against the real api, worker and maintenance.

Invariant checked: an operator with only a browser and a token can watch jobs flow and act on
them: the page asks for the token, goes live, a Flood moves the pipeline until the succeeded
count reaches the flood size, a failing flood puts dead jobs on the page with their final
error, Requeue runs one again, and the job's history shows that second run.

Chromium is Debian's (`apt-get install chromium`), driven through Playwright with
`executable_path`; `playwright install` is never run. Screenshots go to test-artifacts/
(and, with UPDATE_SCREENSHOTS=1, the README's docs/images/dashboard.png).
"""

from __future__ import annotations

import http.client
import os
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect, sync_playwright

from taskline.settings import Settings
from taskline_cli.localservers import free_port
from tests.helpers import service, service_env, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.browser]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "dashboard"
README_SCREENSHOT = ROOT / "docs" / "images" / "dashboard.png"
TOKEN = "browser-test-token"
FLOOD = 50

expect.set_options(timeout=15_000)


def ready(port: int) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", "/readyz")
        ok = conn.getresponse().status == 200
        conn.close()
        return ok
    except OSError:
        return False


@pytest.fixture
def api_port(settings: Settings, tmp_path: Path) -> Iterator[int]:
    """`taskline api` (tokens on), a worker with four slots and maintenance, all real."""
    port = free_port()
    env = service_env(settings, TASKLINE_API_TOKENS=TOKEN)
    logs = tmp_path / "logs"
    with ExitStack() as stack:
        api = stack.enter_context(service(
            ["api", "--bind", f"127.0.0.1:{port}", "--workers", "1"], env, logs))
        stack.enter_context(service(["worker", "--concurrency", "4", "--metrics-port",
                                     str(free_port())], env, logs))
        stack.enter_context(service(["maintenance"], env, logs))
        wait_for(lambda: ready(port) or api.poll() is not None, timeout=20, message="api up")
        assert api.poll() is None, f"taskline api exited; see {logs}"
        yield port


@pytest.fixture
def page(tmp_path: Path) -> Iterator[Page]:
    if not CHROMIUM.exists():
        pytest.fail("Debian's Chromium is missing: apt-get install -y chromium")
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=str(CHROMIUM),
            args=CHROMIUM_ARGS, headless=True, viewport={"width": 1440, "height": 1000})
        context.set_default_timeout(15_000)
        try:
            yield context.pages[0] if context.pages else context.new_page()
        finally:
            context.close()


def shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def count(page: Page, stage: str) -> int:
    text = page.locator(f"#count-{stage}").inner_text()
    return int(text) if text.isdigit() else -1


def flood(page: Page, jobs: int, failure_pct: int, duration_ms: int) -> None:
    """Fill the Flood form and submit it from the keyboard."""
    page.fill("#flood-count", str(jobs))
    page.fill("#flood-failure", str(failure_pct))
    page.fill("#flood-duration", str(duration_ms))
    page.fill("#flood-retries", "0")
    page.focus("#flood-button")
    page.keyboard.press("Enter")
    expect(page.locator("#flood-status")).to_have_text(f"Enqueued {jobs} jobs.")


def watch_succeeded(page: Page, target: int, timeout: float = 30.0) -> list[int]:
    """Every value the succeeded counter shows until it reaches `target`."""
    seen: list[int] = []
    deadline = time.monotonic() + timeout
    while not seen or seen[-1] < target:
        assert time.monotonic() < deadline, f"succeeded stopped at {seen[-1:]}"
        value = count(page, "succeeded")
        if not seen or value != seen[-1]:
            seen.append(value)
        page.wait_for_timeout(40)
    return seen


def sign_in(page: Page, port: int) -> None:
    page.goto(f"http://127.0.0.1:{port}/dashboard")
    dialog = page.locator("#token-dialog")
    expect(dialog).to_be_visible()
    expect(page.locator("#token-input")).to_be_focused()
    page.keyboard.type(TOKEN)
    page.keyboard.press("Enter")
    expect(dialog).to_be_hidden()
    expect(page.locator("#connection")).to_have_text("live")


def test_flood_watch_requeue_and_history(api_port: int, page: Page) -> None:
    sign_in(page, api_port)
    expect(page.locator("#workers-body tr[data-worker]")).to_have_count(1)
    # Which port its /metrics took, for an operator running several on one host.
    expect(page.locator("#workers-body")).to_contain_text(" · metrics :")

    flood(page, FLOOD, failure_pct=0, duration_ms=100)
    seen = watch_succeeded(page, FLOOD)
    assert seen[-1] == FLOOD
    assert any(0 < value < FLOOD for value in seen), f"the counter jumped: {seen}"
    expect(page.locator("#count-queued")).to_have_text("0")
    expect(page.locator("#count-running")).to_have_text("0")
    shot(page, "1-flood-done")

    flood(page, 3, failure_pct=100, duration_ms=0)
    dead_rows = page.locator("#dead-body tr[data-job]")
    expect(dead_rows).to_have_count(3)
    expect(page.locator("#count-dead")).to_have_text("3")
    expect(dead_rows.first).to_contain_text("flood: simulated failure")
    shot(page, "2-dead-jobs")

    job_id = dead_rows.first.get_attribute("data-job")
    assert job_id
    page.locator(f'#dead-body tr[data-job="{job_id}"] button.requeue').click()
    expect(page.locator("#notice")).to_have_text(f"Job {job_id} requeued.")

    page.fill("#search-input", job_id)
    page.keyboard.press("Enter")
    history = page.locator("#history")
    expect(history).to_contain_text(job_id)
    # It ran again: claimed after the requeue, and (failing every time) dead once more.
    expect(history.locator("tr[data-event]")).to_have_count(6)
    events = history.locator("tr[data-event]").evaluate_all(
        "rows => rows.map(r => r.dataset.event)")
    assert events == ["enqueued", "claimed", "dead_lettered", "requeued", "claimed",
                      "dead_lettered"]
    expect(page.locator("#count-dead")).to_have_text("3")
    assert count(page, "succeeded") == FLOOD
    shot(page, "3-history")

    # A longer flood (~20 s of work for four slots): jobs wait by priority, every slot is busy.
    flood(page, 300, failure_pct=10, duration_ms=300)
    expect(page.locator("#count-queued")).not_to_have_text("0")
    expect(page.locator("#count-running")).to_have_text("4")
    expect(page.locator("#workers-body")).to_contain_text("4/4")
    watch_succeeded(page, FLOOD + 20)
    shot(page, "4-busy")
    if os.environ.get("UPDATE_SCREENSHOTS") == "1":
        README_SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        page.evaluate("window.scrollTo(0, 0)")
        page.screenshot(path=str(README_SCREENSHOT))


def test_pause_and_resume_a_queue_from_its_row(api_port: int, page: Page) -> None:
    sign_in(page, api_port)
    flood(page, 5, failure_pct=0, duration_ms=0)
    watch_succeeded(page, 5)
    row = page.locator('#queues-body tr[data-queue="default"]')
    row.locator("button.pause").click()
    expect(page.locator("#notice")).to_have_text("Queue default paused.")
    expect(row).to_contain_text("paused")
    flood(page, 10, failure_pct=0, duration_ms=0)
    expect(page.locator("#count-queued")).to_have_text("10")
    page.wait_for_timeout(1500)
    assert count(page, "succeeded") == 5, "a job ran while its queue was paused"
    shot(page, "5-paused")
    row.locator("button.resume").click()
    expect(page.locator("#notice")).to_have_text("Queue default resumed.")
    watch_succeeded(page, 15)
    expect(row).to_contain_text("running")


def test_flow_limits_show_their_use_and_what_they_hold(api_port: int, page: Page) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", api_port, timeout=5)
    conn.request("PUT", "/api/v1/limits/type:simulate", body='{"concurrency": 1}',
                 headers={"Content-Type": "application/json",
                          "Authorization": f"Bearer {TOKEN}"})
    assert conn.getresponse().status == 201
    conn.close()
    sign_in(page, api_port)
    flood(page, 6, failure_pct=0, duration_ms=1000)
    row = page.locator('#limits-body tr[data-scope="type:simulate"]')
    expect(row).to_contain_text("1/1 running")
    expect(row.locator("td.held")).not_to_have_text("0")
    shot(page, "6-limits")
