"""Claiming ahead: how many jobs a worker holds beyond its handler threads, and the order in
which waiting jobs reach a thread (pure: no servers)."""

from __future__ import annotations

import threading
import time
import uuid
from types import SimpleNamespace

from taskline.execution.attempts import Attempts
from taskline.execution.runner import Ready
from taskline_worker.pace import Pace


def test_nothing_is_claimed_ahead_before_anything_was_measured():
    pace = Pace(8)
    assert pace.ahead == 0
    pace.claimed(0.003)
    assert pace.ahead == 0  # no handler has finished yet


def test_short_handlers_are_claimed_ahead_by_the_slots_that_free_during_a_claim():
    pace = Pace(16)
    pace.claimed(0.002)
    pace.finished(0.010)  # 16 slots of 10 ms free 1,600 a second: 3.2 during a 2 ms claim
    assert pace.ahead == 7  # and two standard deviations (2 x 1.79) above that mean


def test_the_budget_covers_the_scatter_of_the_slots_freeing_during_a_claim():
    pace = Pace(8)
    pace.claimed(0.0023)
    pace.finished(0.0105)  # 1.75 slots free during a claim on average; 4 or more in 1 claim
    assert pace.ahead == 5  # in 10 (a Poisson count), so the mean alone (2) left threads idle


def test_long_handlers_are_not_claimed_ahead():
    pace = Pace(4)
    pace.claimed(0.004)
    pace.finished(2.0)  # 0.008 of a slot frees during a claim: a job claimed ahead would wait
    assert pace.ahead == 0


def test_claiming_ahead_is_capped_by_the_headroom_a_batch_of_half_the_slots_leaves():
    pace = Pace(4)
    pace.claimed(0.050)
    pace.finished(0.0001)  # 2,000 slots would free during one claim
    assert (pace.ahead, pace.batch) == (3, 2)  # 4 + 3 + 1 held at most: twice the slots


def test_the_averages_follow_a_change_of_workload():
    pace = Pace(8)
    pace.claimed(0.004)
    pace.finished(0.010)
    for _ in range(60):
        pace.finished(5.0)
    assert pace.ahead == 0


def test_free_slots_include_the_claim_ahead_budget_within_the_lease_cap():
    ahead = [0]
    attempts = Attempts(4, ahead=lambda: ahead[0])
    assert attempts.free_slots() == 4
    ahead[0] = 3
    assert attempts.free_slots() == 7
    ahead[0] = 100
    assert attempts.free_slots() == attempts.lease_cap


def attempt(priority: int) -> SimpleNamespace:
    return SimpleNamespace(job=SimpleNamespace(priority=priority, id=uuid.uuid4()))


def test_waiting_jobs_reach_a_thread_most_urgent_first_and_fifo_within_a_priority():
    ready = Ready()
    low, first_high, second_high, middle = attempt(2), attempt(9), attempt(9), attempt(5)
    for item in (low, first_high, None, second_high, middle):
        ready.put(item)
    taken = [ready.get() for _ in range(5)]
    assert taken == [first_high, second_high, middle, low, None]


def test_a_thread_waiting_for_work_gets_it_when_it_is_put():
    ready = Ready()
    got = []
    thread = threading.Thread(target=lambda: got.append(ready.get()))
    thread.start()
    job = attempt(5)
    ready.put(job)
    thread.join(5)
    assert got == [job] and not ready.untaken()


def test_a_batch_put_wakes_one_parked_thread_per_job_and_every_job_is_taken_once():
    ready = Ready()
    got: list[object] = []
    lock = threading.Lock()

    def take() -> None:
        item = ready.get()
        with lock:
            got.append(item)

    threads = [threading.Thread(target=take) for _ in range(4)]
    for thread in threads:
        thread.start()
    while ready.idle < 4:  # every thread parked before the put
        time.sleep(0.001)
    jobs = [attempt(5) for _ in range(3)]
    ready.put_many(jobs)
    ready.put(None)  # the fourth thread's stop marker
    for thread in threads:
        thread.join(5)
    assert sorted(map(id, got)) == sorted(map(id, [*jobs, None]))
    assert ready.empty() and ready.idle == 0


def held(lease_id: int) -> SimpleNamespace:
    return SimpleNamespace(lease_id=lease_id, in_slot=True)


def test_jobs_claimed_beyond_the_threads_are_counted_as_waiting_until_threads_free():
    attempts = Attempts(2, ahead=lambda: 2)
    first, second, third, fourth = (held(n) for n in range(4))
    attempts.add_many((first, second, third))
    assert (attempts.running, attempts.waiting) == (2, 1)
    attempts.add(fourth)
    assert (attempts.running, attempts.waiting) == (2, 2)
    attempts.free_slot(first)  # a handler ended: a waiting job takes its thread
    attempts.discard(second)
    assert (attempts.running, attempts.waiting) == (2, 0)


def test_claims_are_batched_only_while_jobs_are_claimed_ahead_and_within_twice_the_slots():
    pace = Pace(8)
    assert pace.batch == 1  # nothing measured: no job waits for a batch
    pace.claimed(0.0023)
    pace.finished(0.0105)
    assert (pace.ahead, pace.batch) == (5, 4)  # half the slots; 8 + 5 + 3 held at most
    pace.claimed(0.050)
    # The budget (a claim's worth of Redis round-trip jobs: more than the slots) yields to the
    # batch; filling the headroom ahead made a claim and a wake-up as each slot freed.
    assert (pace.ahead, pace.batch) == (5, 4)
    long = Pace(8)
    long.claimed(0.004)
    long.finished(2.0)
    assert (long.ahead, long.batch) == (0, 1)
    for slots in range(1, 33):
        for claim_s in (0.0005, 0.002, 0.008):
            pace = Pace(slots)
            pace.claimed(claim_s)
            pace.finished(0.010)
            assert pace.batch >= 1 and pace.ahead + pace.batch - 1 <= slots
            assert pace.batch == (max(1, slots // 2) if pace.ahead else 1)


def test_a_claim_waits_for_a_batch_of_slots_and_no_freed_slot_wakes_it_before():
    batch = [3]
    attempts = Attempts(4, ahead=lambda: 2, batch=lambda: batch[0])  # 4 + 2 + 2 slots
    running = [held(n) for n in range(8)]
    attempts.add_many(running)
    stop = threading.Event()
    assert attempts.reserve(stop, timeout=0.01, most=8) == 0
    reserved: list[int] = []
    fetch = threading.Thread(target=lambda: reserved.append(attempts.reserve(stop, 5, 8)))
    fetch.start()
    for attempt in running[:2]:
        attempts.free_slot(attempt)
    time.sleep(0.05)
    assert reserved == []  # two free: the claim still waits for its third
    attempts.free_slot(running[2])
    fetch.join(5)
    assert reserved == [3]
    attempts.unreserve(3)
    batch[0] = 1  # no longer claiming ahead: one free slot is a claim
    assert attempts.free_slots() == 1 and attempts.reserve(stop, timeout=0.01, most=8) == 1
