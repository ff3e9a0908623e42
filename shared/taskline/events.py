"""Job state changes as the event stream carries them, parsed from the trigger's payload.

Invariant: pure (no I/O). A change is one committed `job_events` row; its `status` is the job's
state right after that event, derived from the event name alone (and, for `recovered`, from
the state the reaper chose, which the row records), never from the job's current row, so a
change heard live and the same change replayed later from job_events read the same.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from taskline.jobs import Event, Status

CHANNEL = "taskline_events"
"""The LISTEN/NOTIFY channel the job_events trigger (migration 0002) publishes on."""

# None: the event records something about an attempt but moves the job nowhere.
STATUS_AFTER: dict[str, Status | None] = {
    Event.ENQUEUED: Status.QUEUED,
    Event.SCHEDULED: Status.SCHEDULED,
    Event.PROMOTED: Status.QUEUED,
    Event.CLAIMED: Status.RUNNING,
    Event.SUCCEEDED: Status.SUCCEEDED,
    Event.FAILED: None,
    Event.RETRY_SCHEDULED: Status.RETRYING,
    Event.DEAD_LETTERED: Status.DEAD,
    Event.CANCEL_REQUESTED: None,
    Event.CANCELLED: Status.CANCELLED,
    Event.RELEASED: Status.QUEUED,
    Event.REQUEUED: Status.QUEUED,
    Event.RESTORED: None,
}


def status_after(event: str, recorded: str | None = None) -> str | None:
    """The job's state right after `event`; `recorded` is the state a `recovered` row names."""
    if event == Event.RECOVERED:
        try:
            return Status(recorded).value
        except ValueError:
            return None
    status = STATUS_AFTER.get(event)
    return status.value if status is not None else None


@dataclass(frozen=True)
class Change:
    """One committed job event, as streamed: who, what, where, and the state it led to."""

    id: int
    job_id: str
    attempt: int
    event: str
    status: str | None
    worker_id: str | None
    created_at: str
    queue: str | None
    type: str | None
    priority: int | None
    error: str | None

    @classmethod
    def from_payload(cls, text: str) -> Change:
        """Parse the trigger's JSON payload; ValueError when it is not one."""
        try:
            raw = json.loads(text)
            return cls(
                id=int(raw["id"]), job_id=str(raw["job_id"]), attempt=int(raw["attempt"]),
                event=str(raw["event"]), status=status_after(raw["event"], raw.get("to")),
                worker_id=raw.get("worker_id"), created_at=str(raw["created_at"]),
                queue=raw.get("queue"), type=raw.get("type"), priority=raw.get("priority"),
                error=raw.get("error"))
        except (TypeError, KeyError, json.JSONDecodeError) as err:
            raise ValueError(f"not a job event payload: {err}") from None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))
