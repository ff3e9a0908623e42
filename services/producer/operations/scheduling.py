"""Creating, replacing and removing schedules, each change with its audit record in one
transaction.

Invariant: a creation that would make more than TASKLINE_MAX_SCHEDULES schedules rolls back
(concurrent creations may pass it by at most their number). The schedule records the principal
that wrote it, whose enqueue quota its slots' jobs count against
(taskline.schedules.QUOTA_CLIENT).
"""

from __future__ import annotations

from typing import Any

from taskline.schedules import QUOTA_CLIENT
from taskline.store.rows import ScheduleRow
from taskline_producer.http.auth import principal
from taskline_producer.operations import auditing
from taskline_producer.operations.backends import backends
from taskline_producer.schemas.errors import ApiError
from taskline_producer.schemas.schedulespec import ScheduleSpec


class ScheduleLimit(ApiError):
    """Creating one more schedule would pass TASKLINE_MAX_SCHEDULES."""

    status = 422
    code = "schedule_limit"


def put(spec: ScheduleSpec) -> tuple[ScheduleRow, bool]:
    """Create or replace the schedule `spec` names: (its row, whether it was created)."""
    b = backends()
    with b.store.transaction() as conn:
        row, created = b.store.upsert_schedule(
            name=spec.name, cron=spec.cron, timezone=spec.timezone, job=_owned(spec.job),
            paused=spec.paused, catch_up=spec.catch_up, conn=conn)
        if created and b.store.count_schedules(conn) > b.settings.max_schedules:
            raise ScheduleLimit(f"there are {b.settings.max_schedules} schedules already "
                                "(TASKLINE_MAX_SCHEDULES); remove one first",
                                {"limit": b.settings.max_schedules})
        auditing.record_in(conn, "schedule.create" if created else "schedule.replace",
                           spec.name, {"cron": spec.cron, "timezone": spec.timezone,
                                       "paused": spec.paused, "catch_up": spec.catch_up,
                                       "queue": spec.job["queue"], "type": spec.job["type"]})
    return row, created


def remove(name: str) -> bool:
    """Remove the schedule `name`; False when there is none. Its jobs and the record of its
    fired slots stay."""
    b = backends()
    with b.store.transaction() as conn:
        if not b.store.delete_schedule(name, conn):
            return False
        auditing.record_in(conn, "schedule.delete", name)
    return True


def _owned(job: dict[str, Any]) -> dict[str, Any]:
    """The job to store: its slots' jobs count against the quota of the calling principal
    (taskline.schedules.QUOTA_CLIENT), when it has a name."""
    client = principal().name
    return job if client is None else {**job, QUOTA_CLIENT: client}
