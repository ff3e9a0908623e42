"""The dashboard with scoped tokens, in a real browser against the real api.

Invariant checked: a token with jobs:read shows the data but not the buttons it may not use
(Flood needs jobs:write, Requeue jobs:operate), each disabled with a tooltip naming the scope;
a token without jobs:read shows nothing and says why.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from taskline.dispatch.dispatcher import Dispatcher
from taskline.settings import Settings
from taskline.store.store import Store
from taskline_cli.localservers import free_port
from tests.browser.test_dashboard import page, ready  # noqa: F401 (the page fixture)
from tests.helpers import service, service_env, wait_for
from tests.integration.test_client_api import make_dead

pytestmark = [pytest.mark.slow, pytest.mark.browser]

TOKENS = "reader:r-browser-token:jobs:read,writer:w-browser-token:jobs:write"


@pytest.fixture
def scoped_port(settings: Settings, tmp_path: Path) -> Iterator[int]:
    port = free_port()
    env = service_env(settings, TASKLINE_API_TOKENS=TOKENS)
    with service(["api", "--bind", f"127.0.0.1:{port}", "--workers", "1"], env,
                 tmp_path / "logs") as api:
        wait_for(lambda: ready(port) or api.poll() is not None, timeout=20, message="api up")
        assert api.poll() is None
        yield port


def enter_token(page: Page, token: str) -> None:  # noqa: F811
    expect(page.locator("#token-dialog")).to_be_visible()
    page.fill("#token-input", token)
    page.keyboard.press("Enter")


def test_buttons_follow_the_token_scopes(scoped_port: int, page: Page,  # noqa: F811
                                         store: Store, dispatcher: Dispatcher) -> None:
    dead_id = make_dead(store, dispatcher)
    page.goto(f"http://127.0.0.1:{scoped_port}/dashboard")
    enter_token(page, "r-browser-token")
    expect(page.locator("#connection")).to_have_text("live")
    expect(page.locator("#token-button")).to_have_text("Token: reader")
    flood = page.locator("#flood-button")
    expect(flood).to_be_disabled()
    expect(flood).to_have_attribute("title", "This token (reader) lacks the jobs:write scope; "
                                             "connect with a token that has it.")
    requeue = page.locator(f'#dead-body tr[data-job="{dead_id}"] button.requeue')
    expect(requeue).to_be_disabled()
    expect(requeue).to_have_attribute("title", "This token (reader) lacks the jobs:operate "
                                               "scope; connect with a token that has it.")

    page.locator("#token-button").click()
    enter_token(page, "w-browser-token")
    expect(page.locator("#token-dialog")).to_be_visible()
    expect(page.locator("#token-error")).to_contain_text("lacks the jobs:read scope")
    expect(page.locator("#notice")).to_contain_text("Nothing can be shown without it.")
