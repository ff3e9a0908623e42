"""The job types blueprint: GET /api/v1/types, what the workers declared they serve.

Invariant: read-only, from PostgreSQL; a type appears while a worker declaring it was seen
within TASKLINE_TYPE_TTL_S, with every schema such workers declared for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flask import Blueprint, Response, jsonify

from taskline_producer.operations import reads
from taskline_producer.schemas.shapes import plain

bp = Blueprint("jobtypes", __name__, url_prefix="/api/v1")


@bp.get("/types")
def list_types() -> Response:
    """Every type declared by a worker seen within TASKLINE_TYPE_TTL_S, by name."""
    rows = reads.declared_types()
    return jsonify({"types": listing(rows)})


def listing(rows: Sequence[Any]) -> list[dict[str, Any]]:
    """One entry per type: its newest declaration's queue and schema, every worker declaring
    it and when one was last seen, and each declared version (`schemas`), newest first."""
    types: dict[str, dict[str, Any]] = {}
    for row in rows:  # newest first within a type
        version = {"queue": row.queue, "schema": row.schema, "workers": list(row.workers),
                   "last_seen": plain(row.last_seen)}
        entry = types.get(row.type)
        if entry is None:
            types[row.type] = {"type": row.type, "queue": row.queue, "schema": row.schema,
                               "workers": list(row.workers), "last_seen": plain(row.last_seen),
                               "schemas": [version]}
            continue
        entry["workers"] = sorted(set(entry["workers"]) | set(row.workers))
        entry["schemas"].append(version)
    return list(types.values())
