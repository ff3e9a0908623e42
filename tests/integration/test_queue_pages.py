"""GET /api/v1/queues in pages: every queue exactly once across the pages in name order, the
totals over every queue beside each page, Redis depths for the page's queues, and a cursor that
is not one the API returned refused; the client and `taskline queues` read every page."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from taskline.client import Client
from taskline.settings import Settings
from tests.integration.test_cli_client import taskline
from tests.integration.test_client_api import start_api


def test_queues_come_in_pages_with_totals_over_every_queue(client):
    names = [f"q{i}" for i in range(5)]
    for name in names:
        assert client.post("/api/v1/jobs", json={"type": "echo", "queue": name,
                                                 "priority": 7}).status_code == 201
    seen, cursor, pages = [], None, []
    while True:
        page = client.get("/api/v1/queues?limit=2" + (f"&cursor={cursor}" if cursor else ""))
        assert page.status_code == 200
        page = page.get_json()
        pages.append(page)
        seen += [q["name"] for q in page["queues"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == names and [len(p["queues"]) for p in pages] == [2, 2, 1]
    for page in pages:
        assert page["totals"]["counts"]["queued"] == 5
        assert page["totals"]["priorities"]["7"]["queued"] == 5
        assert all(q["redis"]["ready_total"] == 1 for q in page["queues"])


@pytest.mark.parametrize("query", ["limit=0", "limit=501", "cursor=%00", "cursor=IQ"])
def test_a_bad_queue_page_parameter_is_a_400(client, query):
    response = client.get(f"/api/v1/queues?{query}")
    assert response.status_code == 400
    assert response.get_json()["error"]["code"] == "invalid_parameter"


@pytest.fixture
def api_url(settings: Settings, tmp_path: Path) -> Iterator[str]:
    yield from start_api(settings, tmp_path / "logs")


def test_the_cli_and_the_client_read_every_page(api_url: str) -> None:
    names = sorted(f"many{i:03}" for i in range(130))
    with Client(api_url) as client:
        client.enqueue_batch([{"type": "echo", "queue": name} for name in names])
        first = client.queues()
        assert len(first["queues"]) == 100 and first["next_cursor"]
        assert first["totals"]["counts"]["queued"] == 130
    shown = taskline("queues", "--json", url=api_url)
    assert shown.returncode == 0, shown.stderr
    assert [q["name"] for q in json.loads(shown.stdout)["queues"]] == names
