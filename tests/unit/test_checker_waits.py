"""The fault checker's judgement of waiting reads (pure): a wait that answered a finished state
answered the job's committed end, or dead before a requeue from the DLQ; and one held across
the job's finish was woken by it, not by the end of its `wait_s`."""

from __future__ import annotations

from datetime import UTC, datetime

from tests.faults.checker import Snapshot, wait_violations, wake_violations


def snap(status: str, events: tuple[str, ...] = ()) -> Snapshot:
    return Snapshot(jobs={"j": {"id": "j", "status": status}},
                    events={"j": [{"event": e} for e in events]}, leases={}, execs={},
                    effects={}, dead_letters={})


def wait(told: str | None, status: int = 200) -> dict:
    return {"op": "wait", "status": status, "path": "/api/v1/jobs/j?wait_s=8",
            "job_status": told}


def test_a_wait_told_the_committed_end_passes():
    assert wait_violations([wait("succeeded"), wait("running")], snap("succeeded")) == []
    assert wait_violations([wait("dead")], snap("queued", ("dead_lettered", "requeued"))) == []


def test_a_wait_told_an_end_the_job_did_not_keep_is_caught():
    (problem,) = wait_violations([wait("succeeded")], snap("retrying"))
    assert "told succeeded, the job is retrying" in problem
    assert wait_violations([wait("succeeded", status=503)], snap("retrying")) == []
    assert wait_violations([{**wait("succeeded"), "op": "get"}], snap("retrying")) == []


FINISHED_AT = datetime(2026, 12, 7, 6, 0, 0, tzinfo=UTC)


def held(sent_after_s: float, answered_after_s: float, told: str = "succeeded") -> dict:
    """A wait sent and answered so many seconds after the job's finish (negative: before)."""
    at = FINISHED_AT.timestamp()
    return {**wait(told), "sent_wall": at + sent_after_s, "recv_wall": at + answered_after_s}


def finished(status: str = "succeeded") -> Snapshot:
    found = snap(status)
    found.jobs["j"]["finished_at"] = FINISHED_AT
    return found


def test_a_waiter_woken_by_the_finish_passes():
    assert wake_violations([held(-5.0, 0.2), held(-0.1, 2.9)], finished()) == []
    # Sent after the finish: answered at once by its read, whenever it was sent.
    assert wake_violations([held(30.0, 30.1)], finished()) == []


def test_a_waiter_held_past_the_finish_is_caught():
    (problem,) = wake_violations([held(-1.0, 7.0)], finished())
    assert "answered 7.0 s after the job's finish" in problem
    # Told another end (an earlier life's), failed, or not a finish: not this judgement's.
    assert wake_violations([held(-1.0, 7.0, told="dead")], finished()) == []
    assert wake_violations([{**held(-1.0, 7.0), "status": 503}], finished()) == []
    assert wake_violations([held(-1.0, 7.0)], snap("succeeded")) == []  # no finished_at
