"""The pieces of dispatch from PostgreSQL that need no server: the notification channel named
alike in SQL and Python, the PostgreSQL claim's candidates chosen by the claim's own source
state, the rebuild marker's parsing, and the waker's generations."""

from __future__ import annotations

import threading

from taskline import transitions as t
from taskline.dispatch.keys import dispatch_marker_ms
from taskline.readiness import CHANNEL
from taskline.store.queries import load_queries
from taskline_worker.degraded import Waker

QUERIES = {name: str(q) for name, q in load_queries().items()}


def test_the_channel_is_the_one_the_sql_notifies() -> None:
    assert f"pg_notify('{CHANNEL}'" in QUERIES["notify_ready"]
    assert CHANNEL == "taskline_enqueued"


def test_postgresql_candidates_are_jobs_the_claim_can_take() -> None:
    due = QUERIES["due_queued_ids"]
    assert t.CLAIM.source_names == ["queued"]
    assert "status = 'queued'" in due and "FOR UPDATE SKIP LOCKED" in due
    assert "queue_pauses p WHERE p.queue = :queue" in due  # a paused queue yields none
    assert "ORDER BY j.priority DESC, j.created_at, j.id" in due
    assert "claimable_rule" in QUERIES["claim_jobs"]  # the claim applies the one rule


def test_the_marker_parses_to_its_instant_or_minus_one() -> None:
    assert dispatch_marker_ms("a1b2:1700000000123") == 1700000000123
    assert dispatch_marker_ms(None) == -1
    assert dispatch_marker_ms("") == -1
    assert dispatch_marker_ms("garbled") == -1
    assert dispatch_marker_ms("x:12ab") == -1


def test_a_waker_wakes_a_sleeper_that_saw_an_older_generation() -> None:
    waker = Waker()
    seen = waker.generation
    assert waker.wait(seen, 0.01) is False  # nothing happened: the timeout ends the sleep
    threading.Timer(0.05, waker.poke).start()
    assert waker.wait(seen, 5.0) is True
    assert waker.wait(seen, 0.0) is True  # a poke before the sleep is not missed
