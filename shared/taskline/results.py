"""What waiting for a job gives back: its result, or the exception its end calls for.

Shared by `taskline.wait` (on a database connection) and the clients (over the API), so both
answer a dead job with JobFailed and a cancelled one with JobCancelled the same way.
"""

from __future__ import annotations

from typing import Any

from taskline.errors import JobCancelled, JobFailed
from taskline.jobs import TERMINAL

TERMINAL_STATUSES = frozenset(status.value for status in TERMINAL)
WORKFLOW_FINISHED = frozenset({"succeeded", "failed", "cancelled"})


def finished(job: dict[str, Any]) -> bool:
    """Whether `job` (a job as the API shows it) is succeeded, dead or cancelled."""
    return job.get("status") in TERMINAL_STATUSES


def outcome(job: dict[str, Any], raise_on_failure: bool = True) -> Any:
    """The result of a finished job (the API's form); JobFailed for a dead one and
    JobCancelled for a cancelled one, unless `raise_on_failure` is false (then the job)."""
    if not raise_on_failure:
        return job
    status = job.get("status")
    if status == "dead":
        raise JobFailed(f"job {job.get('id')} failed after {job.get('attempts')} attempts: "
                        f"{job.get('last_error')}", job, job.get("last_error"),
                        job.get("attempts"))
    if status == "cancelled":
        raise JobCancelled(f"job {job.get('id')} was cancelled", job)
    return job.get("result")


def workflow_outcome(workflow: dict[str, Any], raise_on_failure: bool = True) -> dict[str, Any]:
    """A finished workflow (the API's form); JobFailed when it failed (the first dead step's
    error) and JobCancelled when it was cancelled, unless `raise_on_failure` is false."""
    status = workflow.get("status")
    if raise_on_failure and status == "failed":
        dead = [s for s in workflow.get("steps", []) if s.get("status") == "dead"]
        error = dead[0].get("last_error") if dead else None
        raise JobFailed(f"workflow {workflow.get('id')} failed: {error}", workflow, error,
                        dead[0].get("attempts") if dead else None)
    if raise_on_failure and status == "cancelled":
        raise JobCancelled(f"workflow {workflow.get('id')} was cancelled", workflow)
    return workflow
