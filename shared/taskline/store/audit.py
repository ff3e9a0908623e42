"""The audit trail's statements: append a record (in the caller's transaction when given), list
records newest first, delete those past their retention."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from taskline.store.aggregate import Aggregate
from taskline.store.params import json_text


class AuditTrail(Aggregate):
    def insert_audit(self, *, actor: str | None, action: str, target: str | None,
                     detail: Any = None, conn: Connection | None = None) -> dict:
        """Append one audit record; pass `conn` to commit it with the change it records."""
        rows = self._run("insert_audit", {"actor": actor, "action": action, "target": target,
                                          "detail": json_text(detail)}, conn)
        return dict(rows[0]._mapping)

    def list_audit(self, *, actor: str | None, action: str | None,
                   after: tuple[datetime, uuid.UUID] | None, limit: int) -> list[dict]:
        params = {"actor": actor, "action": action, "limit": limit,
                  "after_at": after[0] if after else None,
                  "after_id": after[1] if after else None}
        return [dict(r._mapping) for r in self._run("list_audit", params)]

    def delete_expired_audit(self, retain_s: float, limit: int) -> int:
        """Delete up to `limit` records older than `retain_s`; how many were deleted."""
        return len(self._run("delete_expired_audit", {"retain_s": retain_s, "limit": limit}))
