"""Parameters of taskline's statements: job ids as one array literal, JSON text, insert rows,
and the states and events a move takes from the lifecycle's table (taskline.transitions).

Every aggregate of the store (taskline.store.store and its siblings) builds its parameters here,
so a status a statement sets always comes from a `Move` (tests/unit/test_state_places.py).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import orjson

from taskline import transitions
from taskline.jobs import parse_job_id
from taskline.transitions import Move

CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
"""A uuid as PostgreSQL and `str(uuid.UUID)` write it."""


def uuids(ids: Sequence[uuid.UUID | str]) -> list[str]:
    """The ids that are UUIDs. Anything else pushed into Redis names no job, and must read as
    absent rather than fail the whole statement (and with it every later reconciliation)."""
    # Ids from Redis are canonical (str of a UUID): a match spares building a UUID per id.
    return [text for text in map(str, ids)
            if CANONICAL_UUID.fullmatch(text) or parse_job_id(text) is not None]


def uuid_array(ids: Sequence[uuid.UUID | str]) -> str:
    """`uuids` as one PostgreSQL array literal: psycopg dumps a list element by element in
    Python, a string at once (the id list of a claim showed in a busy worker's profile)."""
    return "{" + ",".join(uuids(ids)) + "}"


def json_text(value: Any) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"))


def _plain(value: Any) -> str:
    """JSON for the ids and times of insert rows (json.dumps calls it for nothing else)."""
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def rows_json(rows: Sequence[dict[str, Any]] | dict[str, Any]) -> str:
    """Insert rows as one JSON array: orjson (ids and times included) unless a payload holds an
    integer past 64 bits, which only the standard library writes."""
    try:
        return orjson.dumps(rows).decode()
    except TypeError:  # orjson.JSONEncodeError
        return json.dumps(rows, separators=(",", ":"), ensure_ascii=False, default=_plain)


def move_params(move: Move) -> dict[str, Any]:
    """The states and event a statement takes from the lifecycle's table."""
    return {"sources": move.source_names, "target": move.target.value,
            "event": move.event.value}


def cascade(cause: str) -> dict[str, Any]:
    """step_cascade_ctes' parameters: the cancel move for what waits for a success, the
    unblock move for the `when` steps the cancellations decide, and the cause recorded."""
    return {"cascade_target": transitions.CANCEL.target.value,
            "cascade_event": transitions.CANCEL.event.value, "cause": cause,
            "release_target": transitions.UNBLOCK.target.value,
            "release_event": transitions.UNBLOCK.event.value}


FIRST_EVENTS = json.dumps(dict(transitions.FIRST_EVENTS))
