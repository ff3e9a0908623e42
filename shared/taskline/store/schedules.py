"""The schedules' statements: create or replace, read, list, count and remove periodic jobs.

Firing a slot writes a job, and lives with the enqueue statements (taskline.store.store).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection

from taskline.store.aggregate import Aggregate
from taskline.store.params import json_text
from taskline.store.rows import ScheduleRow


class Schedules(Aggregate):
    def upsert_schedule(self, *, name: str, cron: str, timezone: str, job: dict[str, Any],
                        paused: bool, catch_up: str,
                        conn: Connection | None = None) -> tuple[ScheduleRow, bool]:
        """Create or replace a schedule: (the row, whether it was created)."""
        rows = self._run("upsert_schedule", {"name": name, "cron": cron, "timezone": timezone,
                                             "job": json_text(job), "paused": paused,
                                             "catch_up": catch_up}, conn)
        return ScheduleRow.from_row(rows[0]), bool(rows[0].created)

    def mark_declared_schedules(self, names: Sequence[str]) -> dict[str, bool]:
        """Mark `names` as the schedules the code declares (and the others it declared before
        as no longer); {name: declared in code now} of every schedule the code declares or
        once did."""
        rows = self._run("mark_declared_schedules", {"names": list(names)})
        return {r.name: bool(r.declared_in_code) for r in rows}

    def get_schedule(self, name: str) -> ScheduleRow | None:
        rows = self._run("get_schedule", {"name": name})
        return ScheduleRow.from_row(rows[0]) if rows else None

    def list_schedules(self, after: str | None, limit: int) -> list[ScheduleRow]:
        return [ScheduleRow.from_row(r)
                for r in self._run("list_schedules", {"after": after, "limit": limit})]

    def count_schedules(self, conn: Connection | None = None) -> int:
        return int(self._run("count_schedules", {}, conn)[0].n)

    def delete_schedule(self, name: str, conn: Connection | None = None) -> bool:
        return bool(self._run("delete_schedule", {"name": name}, conn))

    def active_schedules(self) -> list[ScheduleRow]:
        return [ScheduleRow.from_row(r) for r in self._run("active_schedules", {})]
