"""The job types a worker serves: recorded in PostgreSQL and logged when the worker starts.

Each record carries the type, its default queue and its payload's JSON Schema (None: any
payload), so the API can check payloads of declared types and `GET /api/v1/types` can say who
serves what. A worker records every type it loaded, built-ins included: a type served only by
workers unseen for longer than TASKLINE_TYPE_TTL_S counts as undeclared again.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from taskline.handlers import registry

if TYPE_CHECKING:
    from taskline.settings import Settings
    from taskline.store.store import Store

log = logging.getLogger(__name__)


def served() -> list[dict[str, Any]]:
    """{"type", "queue", "schema"} of every handler registered in this process, by type."""
    return [{"type": h.type, "queue": h.queue, "schema": h.schema}
            for h in registry.declarations()]


def record(store: Store, worker_id: str, settings: Settings) -> list[dict[str, Any]]:
    """Write this worker's types (replacing what it wrote before) and log them; what was
    written. Declarations of workers unseen for TASKLINE_TYPE_TTL_S are forgotten meanwhile."""
    types = served()
    store.declare_types(worker_id, types, settings.type_ttl_s)
    log.info("worker serves %d job types: %s", len(types), ", ".join(t["type"] for t in types),
             extra={"action": "declare", "worker": worker_id,
                    "types": [t["type"] for t in types],
                    "declared": [t["type"] for t in types if t["schema"] is not None]})
    return types
