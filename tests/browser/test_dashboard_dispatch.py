"""The dashboard says so while Redis is unreachable: a real browser against a real api whose
Redis address answers nothing. The page reads the dispatch mode from GET /api/v1/queues and
shows that workers dispatch from PostgreSQL, while the pipeline counts (PostgreSQL's) still
fill in."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from taskline.settings import Settings
from taskline_cli.localservers import free_port
from tests.browser.test_dashboard import page, ready  # noqa: F401 (the page fixture)
from tests.helpers import service, service_env, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.browser]


@pytest.fixture
def api_without_redis(settings: Settings, tmp_path: Path) -> Iterator[int]:
    port = free_port()
    env = service_env(settings.replace(redis_url=f"redis://127.0.0.1:{free_port()}/0"))
    with service(["api", "--bind", f"127.0.0.1:{port}", "--workers", "1"], env,
                 tmp_path / "logs") as api:
        wait_for(lambda: ready(port) or api.poll() is not None, timeout=20, message="api up")
        assert api.poll() is None, "taskline api exited"
        yield port


def test_the_dashboard_shows_dispatch_from_postgresql(api_without_redis: int,
                                                      page: Page) -> None:  # noqa: F811
    page.goto(f"http://127.0.0.1:{api_without_redis}/dashboard")
    banner = page.locator("#dispatch")
    expect(banner).to_be_visible()
    expect(banner).to_contain_text("workers dispatch from PostgreSQL")
    expect(page.locator("#count-queued")).to_have_text("0")
