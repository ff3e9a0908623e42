"""The dead-letter queue's statements: list and group dead jobs, requeue or purge them in bulk.

A bulk move takes its sources and target from the lifecycle's table (REQUEUE, PURGE), skips
rows other transactions hold, and returns what it changed for Redis to follow.
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from taskline import transitions
from taskline.jobs import Job
from taskline.store.aggregate import Aggregate
from taskline.store.params import cascade, move_params, uuid_array
from taskline.store.rows import DeadChanged, Released


@dataclass(frozen=True)
class DeadFilter:
    """Which dead jobs a bulk operation matches: every given field, combined with AND."""

    queue: str | None = None
    type: str | None = None
    ids: tuple[uuid.UUID, ...] | None = None
    fingerprint: str | None = None
    """The cause (taskline.fingerprint) of their final error."""

    def params(self) -> dict[str, Any]:
        return {"queue": self.queue, "type": self.type,
                "ids": None if self.ids is None else uuid_array(self.ids),
                "fingerprint": self.fingerprint}


class DeadLetters(Aggregate):
    def list_dead(self, *, queue: str | None, after: tuple[datetime, uuid.UUID] | None,
                  limit: int) -> list[dict]:
        params = {"queue": queue, "limit": limit, "after_failed": after[0] if after else None,
                  "after_id": after[1] if after else None}
        return [{"job": Job.from_row(r), "final_error": r.final_error,
                 "fingerprint": r.fingerprint, "attempts": r.dead_attempts,
                 "failed_at": r.failed_at}
                for r in self._run("list_dead", params)]

    def dlq_groups(self, *, queue: str | None, limit: int) -> list[dict]:
        """Dead jobs grouped by the cause of their final error, most jobs first."""
        return [dict(r._mapping) for r in self._run("dlq_groups", {"queue": queue,
                                                                   "limit": limit})]

    def requeue_dead_batch(self, match: DeadFilter, after: uuid.UUID, limit: int,
                           actor: str | None = None,
                           conn: Connection | None = None) -> list[DeadChanged]:
        """Requeue up to `limit` dead jobs matching `match` with ids above `after` (one
        statement); rows another transaction holds are skipped, not waited for."""
        params = {**match.params(), "after": after, "limit": limit, "actor": actor,
                  **move_params(transitions.REQUEUE)}
        return [DeadChanged.from_row(r, transitions.REQUEUE)
                for r in self._run("requeue_dead_batch", params, conn)]

    def purge_dead(self, match: DeadFilter, after: uuid.UUID, limit: int,
                   conn: Connection | None = None, actor: str | None = None) -> list[DeadChanged]:
        """Delete up to `limit` dead jobs matching `match` with ids above `after`, each whole
        (events, leases, DLQ row), in one statement: the one place a purge deletes jobs. The
        waiting dependents of a purged workflow step are cancelled in that statement, and the
        `when` steps those cancellations queue ride on the last row's `released`."""
        params = {**match.params(), "after": after, "limit": limit, "actor": actor,
                  **move_params(transitions.PURGE), **cascade("parent_purged")}
        rows = self._run("purge_dead_batch", params, conn)
        purged = [DeadChanged.from_row(r, transitions.PURGE) for r in rows if r.kind == "purged"]
        released = tuple(Released.from_row(r) for r in rows if r.kind == "released")
        if released and purged:
            purged[-1] = dataclasses.replace(purged[-1], released=released)
        return purged

    def count_dead_matching(self, match: DeadFilter) -> int:
        return int(self._run("count_dead_matching", match.params())[0].n)
