"""The fault checker's own judges of the new job semantics (not the product's): one lease open at
a time per queue and key, first starts in enqueue order, a requeued job judged by its new place
only, other keys and queues apart; and no lease begun after the job's expiry; on hand-made
snapshots."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.faults.checker import Snapshot, expiry_violations, ordering_violations

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def snapshot(jobs: dict[str, tuple[str, str | None, float]],
             leases: dict[str, list[tuple[float, float | None]]],
             requeued: frozenset[str] = frozenset()) -> Snapshot:
    """jobs: id -> (queue, ordering key, created at); leases: id -> [(start, end)]."""
    return Snapshot(
        jobs={j: {"queue": q, "ordering_key": k, "created_at": at(c)}
              for j, (q, k, c) in jobs.items()},
        events={j: [{"event": "requeued"}] for j in requeued},
        leases={j: [{"leased_at": at(s), "released_at": None if e is None else at(e)}
                    for s, e in spans] for j, spans in leases.items()},
        execs={}, effects={}, dead_letters={})


def test_one_at_a_time_in_order_passes_and_other_keys_and_queues_are_apart():
    snap = snapshot({"a": ("q", "k", 0), "b": ("q", "k", 1), "c": ("q", "k2", 2),
                     "d": ("r", "k", 3), "e": ("q", None, 4)},
                    {"a": [(10, 11), (12, 13)], "b": [(13, 14)], "c": [(10, 20)],
                     "d": [(10, 20)], "e": [(10, 20)]})
    assert ordering_violations(snap) == []


def test_two_leases_of_a_key_at_once_are_reported():
    snap = snapshot({"a": ("q", "k", 0), "b": ("q", "k", 1)},
                    {"a": [(10, 12)], "b": [(11, 13)]})
    assert ordering_violations(snap) == ["ordering key 'k' of queue q: 2 leases open at once"]


def test_a_later_job_starting_first_is_reported_unless_the_earlier_was_requeued():
    jobs = {"a": ("q", "k", 0), "b": ("q", "k", 1)}
    leases = {"a": [(20, 21)], "b": [(10, 11)]}
    assert ordering_violations(snapshot(jobs, leases)) == [
        "ordering key 'k' of queue q: job b started before job a, enqueued earlier"]
    assert ordering_violations(snapshot(jobs, leases, requeued=frozenset({"a"}))) == []


def test_no_lease_begins_after_the_jobs_expiry():
    job = {"expires_at": at(10)}
    early = {"id": 1, "leased_at": at(9.9)}
    late = {"id": 2, "leased_at": at(11)}
    assert expiry_violations(job, [early]) == []
    assert expiry_violations({"expires_at": None}, [late]) == []
    assert [v.split(" began")[0] for v in expiry_violations(job, [early, late])] == ["lease 2"]
