"""The dashboard's workflows: a submitted workflow shows its step counts as they run, the pipeline
counts steps waiting for their parents, Cancel stops a running workflow, and a state or a
button's label is never broken over two lines in the narrow columns."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from taskline.client import Client
from tests.browser.test_dashboard import TOKEN, api_port, page, sign_in  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def step(step_id: str, after: list[str] = (), delay_ms: int = 0) -> dict:
    return {"id": step_id, "job": {"type": "simulate", "payload": {"sleep_s": delay_ms / 1000}},
            "after": list(after)}


def test_a_workflow_is_shown_step_by_step_and_can_be_cancelled(api_port: int,  # noqa: F811
                                                               page: Page) -> None:  # noqa: F811
    sign_in(page, api_port)
    with Client(f"http://127.0.0.1:{api_port}", token=TOKEN) as client:
        # Four steps, as a report built from parts: enough to narrow the other columns.
        quick = client.submit_workflow("quick", [
            step("fetch"), step("part1", ["fetch"]), step("part2", ["fetch"]),
            step("merge", ["part1", "part2"])])
        slow = client.submit_workflow("slow", [step("a", delay_ms=20_000), step("b", ["a"]),
                                               step("c", ["b"])])
    quick_row = page.locator(f"#workflows-body tr[data-workflow='{quick['id']}']")
    expect(quick_row.locator(".badge").first).to_have_text("succeeded", timeout=20_000)
    slow_row = page.locator(f"#workflows-body tr[data-workflow='{slow['id']}']")
    expect(slow_row.get_by_label("2 steps waiting")).to_be_visible()
    expect(page.locator("#count-waiting")).to_have_text("2")
    slow_row.get_by_role("button", name="Cancel workflow slow").click()
    expect(slow_row.get_by_label(re.compile(r"^[23] steps cancelled$"))).to_be_visible()
    expect(page.locator("#count-waiting")).to_have_text("0")
    for label in (quick_row.locator(".badge").first,
                  quick_row.get_by_role("button", name="Cancel workflow quick")):
        assert _lines(label) == 1, label


def _lines(element) -> int:
    """How many lines of text `element` is laid out on."""
    return element.evaluate("""e => {
        const s = getComputedStyle(e);
        const inner = e.getBoundingClientRect().height - parseFloat(s.paddingTop)
            - parseFloat(s.paddingBottom) - parseFloat(s.borderTopWidth)
            - parseFloat(s.borderBottomWidth);
        const line = parseFloat(s.lineHeight) || parseFloat(s.fontSize) * 1.2;
        return Math.round(inner / line);
    }""")


def test_a_failure_step_unmet_is_counted_under_its_cause_not_as_a_cancellation(
        api_port: int, page: Page) -> None:  # noqa: F811
    sign_in(page, api_port)
    with Client(f"http://127.0.0.1:{api_port}", token=TOKEN) as client:
        wf = client.submit_workflow("guarded", [
            step("load"), {**step("on_fail", ["load"]), "when": "any_failed"},
            {**step("finally", ["load"]), "when": "always"}])
    row = page.locator(f"#workflows-body tr[data-workflow='{wf['id']}']")
    expect(row.locator(".badge").first).to_have_text("succeeded", timeout=20_000)
    expect(row.get_by_label("1 step condition_unmet")).to_be_visible()
    expect(row.get_by_label("2 steps succeeded")).to_be_visible()
    expect(row.get_by_label(re.compile("cancelled"))).to_have_count(0)
    on_fail = next(s["job_id"] for s in wf["steps"] if s["id"] == "on_fail")
    page.fill("#search-input", on_fail)
    page.keyboard.press("Enter")
    history = page.locator("#history")
    expect(history).to_contain_text("any_failed")
    expect(history.locator("tr[data-event='cancelled']")).to_contain_text("condition_unmet")
