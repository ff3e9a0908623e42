"""GET /api/v1/queues in pages: every queue exactly once across the pages in name order, the
totals over every queue beside each page, Redis depths for the page's queues, and a cursor that
is not one the API returned refused."""

from __future__ import annotations

import pytest


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
