"""The lease keeper against real PostgreSQL: an attempt that starts with its lease already
partly spent (a slow claim, or a wait before its start) is renewed at once, not a period later,
so on a slow link its renewal answers before the self-fence's deadline; a fresh one waits for
the keeper's period, costing no statement."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from taskline.execution.attempts import Attempt, Attempts
from taskline.execution.leases import LeaseKeeper
from tests.helpers import enqueue

LEASE_S = 15.0  # production's lease: renewed every 5 s, fenced 1.5 s before it could lapse
WORKER = "lease-keeper-test"


@contextmanager
def running_keeper(store, settings) -> Iterator[tuple[LeaseKeeper, Attempts]]:
    attempts = Attempts(4)
    keeper = LeaseKeeper(store=store, worker_id=WORKER, settings=settings.replace(
        lease_s=LEASE_S, heartbeat_s=5.0), attempts=attempts, on_renewed=lambda a: None)
    stop = threading.Event()
    thread = threading.Thread(target=keeper.run, args=(stop,), daemon=True)
    thread.start()
    keeper.passes.wait(after=0)  # the first pass, with nothing held, is over
    try:
        yield keeper, attempts
    finally:
        stop.set()
        keeper.wake()
        thread.join(5)
        assert not thread.is_alive(), "a woken keeper ends its loop once stopped"


def claimed_attempt(store, dispatcher, sent_ago_s: float) -> Attempt:
    """An attempt on a real lease whose claim was sent `sent_ago_s` seconds ago."""
    job = enqueue(store, dispatcher, "echo", push=False)
    sent_at = time.monotonic() - sent_ago_s
    [claimed] = store.claim_jobs([job.id], WORKER, LEASE_S)
    return Attempt.begin(claimed, WORKER, sent_at, LEASE_S, LEASE_S / 10)


def test_an_attempt_started_late_is_renewed_at_once(store, settings, dispatcher):
    with running_keeper(store, settings) as (keeper, attempts):
        late = claimed_attempt(store, dispatcher, sent_ago_s=9.0)  # 4.5 s of its 13.5 s left
        deadline = late.lease_deadline
        attempts.add_many([late])
        passes = keeper.passes.count
        keeper.started([late])
        assert keeper.passes.wait(after=passes, timeout=2.0) == {"ok": 1, "lost": 0}
        assert late.lease_deadline > deadline + 8.0  # 13.5 s from the renewal's send


def test_a_fresh_attempt_waits_for_the_period(store, settings, dispatcher):
    with running_keeper(store, settings) as (keeper, attempts):
        fresh = claimed_attempt(store, dispatcher, sent_ago_s=0.0)
        attempts.add_many([fresh])
        passes = keeper.passes.count
        keeper.started([fresh])
        time.sleep(1.0)
        assert keeper.passes.count == passes  # no renewal before the period is up
