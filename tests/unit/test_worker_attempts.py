"""An attempt's fate is settled exactly once, its local lease deadline only moves forward,
running handlers bound the worker's slots and held leases are capped at a multiple of that."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime

from taskline.execution.attempts import LEASE_CAP_FACTOR, Attempt, Attempts, Settler
from taskline.jobs import Job, Status
from taskline.store.store import Claimed

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def make_attempt(lease_id: int = 1, cancel_requested: bool = False, sent_at: float = 100.0,
                 attempts: int = 1, job_id: uuid.UUID | None = None,
                 job_type: str = "echo") -> Attempt:
    job = Job(id=job_id or uuid.uuid4(), type=job_type, queue="default", payload={}, priority=5,
              status=Status.RUNNING, attempts=attempts, max_retries=3, timeout_s=30.0,
              next_run_at=NOW, idempotency_key=None, last_error=None, result=None,
              created_at=NOW, updated_at=NOW, cancel_requested=cancel_requested)
    return Attempt.begin(Claimed(job, lease_id, NOW), "w1", sent_at, lease_s=15, margin_s=5)


def test_only_the_first_settler_owns_the_outcome():
    attempt = make_attempt()
    barrier = threading.Barrier(8)
    wins: list[Settler] = []

    def race(by: Settler) -> None:
        barrier.wait()
        if attempt.settle(by):
            wins.append(by)

    threads = [threading.Thread(target=race, args=(by,)) for by in list(Settler) * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1 and attempt.settled_by is wins[0]


def test_the_local_lease_deadline_keeps_a_safety_margin_and_only_moves_forward():
    attempt = make_attempt(sent_at=100.0)
    assert attempt.lease_deadline == 110.0  # sent + lease 15 - margin 5
    assert attempt.lease_valid(now=109.9) and not attempt.lease_valid(now=110.0)
    attempt.renewed(sent_at=104.0, lease_s=15, margin_s=5)
    assert attempt.lease_deadline == 114.0
    attempt.renewed(sent_at=101.0, lease_s=15, margin_s=5)  # a late answer to an old renewal
    assert attempt.lease_deadline == 114.0
    attempt.fenced = True
    assert not attempt.lease_valid(now=105.0)


def test_renewal_stops_once_the_attempt_cannot_report():
    attempt = make_attempt()
    assert attempt.renewable
    attempt.settle(Settler.HANDLER)
    assert attempt.renewable  # its success may still be waiting to be written
    timed_out = make_attempt(lease_id=2)
    timed_out.settle(Settler.TIMEOUT)
    lost = make_attempt(lease_id=3)
    lost.lost = True
    assert not timed_out.renewable and not lost.renewable


def test_a_job_claimed_with_a_cancel_request_starts_stopping():
    attempt = make_attempt(cancel_requested=True)
    assert attempt.cancel_requested and attempt.ctx.stopping
    assert attempt.ctx.attempt == 1 and attempt.ctx.worker_id == "w1"


def test_a_thread_is_written_off_only_while_its_handler_runs():
    attempt = make_attempt()
    assert not attempt.write_off()
    attempt.begin_run()
    assert attempt.write_off()
    assert attempt.end_run() is True
    finished = make_attempt(lease_id=2)
    finished.begin_run()
    assert finished.end_run() is False and not finished.write_off()


def two_running() -> tuple[Attempts, Attempt, Attempt]:
    """Two slots, both taken by a running attempt."""
    held = Attempts(concurrency=2)
    first, second = make_attempt(1), make_attempt(2)
    held.add_many([first, second])
    return held, first, second


def test_held_attempts_bound_the_free_slots():
    held, first, second = two_running()
    stop = threading.Event()
    assert held.wait_for_free_slot(stop, timeout=0.01) == 0
    threading.Timer(0.05, held.discard, args=(first,)).start()
    assert held.wait_for_free_slot(stop, timeout=5) == 1
    held.discard(first)  # idempotent
    assert held.snapshot() == [second] and held.holds(second) and not held.holds(first)
    force = threading.Event()
    force.set()
    assert held.wait_until_empty(timeout=5, force=force) is False


def test_an_ended_handler_frees_its_slot_but_keeps_its_lease():
    held, first, _ = two_running()
    stop = threading.Event()
    threading.Timer(0.05, held.free_slot, args=(first,)).start()
    assert held.wait_for_free_slot(stop, timeout=5) == 1
    held.free_slot(first)  # idempotent: the slot is not freed twice
    assert held.busy == 1 and held.free_slots() == 1
    assert held.holds(first) and len(held) == 2  # still renewed until its outcome is written
    held.discard(first)  # the outcome was written: no second release of the slot
    assert held.busy == 1 and held.free_slots() == 1 and len(held) == 1


def test_leases_waiting_for_their_outcome_are_capped_at_a_multiple_of_the_slots():
    held = Attempts(concurrency=2)
    cap = LEASE_CAP_FACTOR * 2
    waiting = [make_attempt(lease_id) for lease_id in range(1, cap + 1)]
    for attempt in waiting:
        held.add(attempt)
        held.free_slot(attempt)  # handler ended; the outcome is not written yet
    assert held.busy == 0 and len(held) == cap
    assert held.wait_for_free_slot(threading.Event(), timeout=0.01) == 0
    held.discard(waiting[0])
    assert held.free_slots() == 1


def test_fetch_loops_never_reserve_more_than_the_free_slots_together():
    held = Attempts(concurrency=3)
    held.add(make_attempt(1))
    stop = threading.Event()
    assert held.reserve(stop, timeout=0.01, most=10) == 2  # what one loop may fetch
    assert held.reserve(stop, timeout=0.01, most=10) == 0  # the other loop gets none meanwhile
    held.unreserve(2)  # the first loop's claim is done (its winners were added)
    assert held.reserve(stop, timeout=0.01, most=1) == 1
    stop.set()
    held.unreserve(1)
    assert held.reserve(stop, timeout=5, most=10) == 0  # a stopping worker takes nothing


def test_the_stop_event_is_set_whether_it_was_asked_for_before_or_after_the_stop():
    early, late = make_attempt(1), make_attempt(2)
    event = early.ctx.stop_event  # a handler waiting on it before any stop request
    assert not event.is_set() and not early.ctx.stopping
    early.stop()
    late.stop()
    assert event.is_set() and early.ctx.stopping
    assert late.ctx.stopping and late.ctx.stop_event.is_set()  # made after the stop: born set
    assert early.ctx.stop_event is event  # one event per context
