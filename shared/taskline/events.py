"""Job state changes as the event stream carries them, and the order it releases them in.

Invariant: pure (no I/O). A change is one committed `job_events` row; its `status` is the job's
state right after that event, derived from the lifecycle's table (taskline.transitions) by the
event name alone (and, for `recovered`, from the state the reaper recorded in the row), never
from the job's current row, so a change read
live and the same change replayed later read the same.

Ids are taken when an event is inserted but become visible when its transaction commits, so a
reader tailing job_events by id sees gaps: an id whose transaction is still running (it will
appear) or rolled back (it never will). `Sequencer` releases ids strictly in order and holds
back everything after a gap until every transaction that could still fill it has ended (the
transaction horizon has passed it), or `max_wait_s` has passed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from taskline.transitions import status_after


def _iso(value: datetime | str) -> str:
    if isinstance(value, str):
        return value
    return value.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Change:
    """One committed job event, as streamed: who, what, where, and the state it led to."""

    id: int
    job_id: str
    attempt: int
    event: str
    status: str | None
    worker_id: str | None
    actor: str | None
    created_at: str
    queue: str | None
    type: str | None
    priority: int | None
    error: str | None
    progress: Any = None
    """A `progress` event's value (0..1 or a JSON object); None for every other event."""

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Change:
        """A row of the store's events_after / newest_events_after queries."""
        return cls(
            id=int(row["id"]), job_id=str(row["job_id"]), attempt=int(row["attempt"]),
            event=str(row["event"]), status=status_after(row["event"], row["recorded_status"]),
            worker_id=row["worker_id"], actor=row.get("actor"), created_at=_iso(row["created_at"]),
            queue=row["queue"], type=row["type"],
            priority=None if row["priority"] is None else int(row["priority"]),
            error=row["error"], progress=row.get("progress"))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))


Horizon = tuple[int, int]
"""(oldest transaction id still running, next transaction id to be assigned)."""


class Sequencer:
    """Releases event ids strictly in id order, waiting out gaps that may still fill.

    A gap first seen when the next transaction id was `next` can only be filled by a
    transaction older than `next`; once the oldest running transaction is `next` or newer,
    the missing ids are never coming (rolled back) and the ids after them are released.
    """

    def __init__(self, cursor: int, max_wait_s: float) -> None:
        self.cursor = cursor
        self.max_wait_s = max_wait_s
        self._gap_horizon: int | None = None  # `next` when the current gap was first seen
        self._gap_since = 0.0

    @property
    def waiting(self) -> bool:
        return self._gap_horizon is not None

    def release(self, ids: Sequence[int], horizon: Callable[[], Horizon],
                now: float) -> list[int]:
        """The prefix of `ids` (ascending, all above the cursor) that may be streamed now.

        `horizon` is called only when a gap is at stake, at most once.
        """
        seen: list[Horizon] = []

        def current() -> Horizon:
            if not seen:
                seen.append(horizon())
            return seen[0]

        released: list[int] = []
        for event_id in ids:
            if event_id != self.cursor + 1 and not self._gap_closed(current, now):
                self._open_gap(current, now)
                break
            released.append(event_id)
            self.cursor = event_id
            self._gap_horizon = None
        return released

    def _gap_closed(self, current: Callable[[], Horizon], now: float) -> bool:
        if self._gap_horizon is None:
            return False
        if now - self._gap_since >= self.max_wait_s:
            return True
        return current()[0] >= self._gap_horizon

    def _open_gap(self, current: Callable[[], Horizon], now: float) -> None:
        if self._gap_horizon is None:
            self._gap_horizon = current()[1]
            self._gap_since = now
