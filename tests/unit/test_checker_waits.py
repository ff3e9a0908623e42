"""The fault checker's judgement of waiting reads (pure): a wait that answered a finished state
answered the job's committed end, or dead before a requeue from the DLQ."""

from __future__ import annotations

from tests.faults.checker import Snapshot, wait_violations


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
