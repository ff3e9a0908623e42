"""Query parameters of the list routes: limits, filters and opaque keyset cursors.

Invariant: a cursor is base64url of the (timestamp, id), the id or the name alone, of the last
row of a page, and nothing read from the query string reaches SQL before it is checked (a NUL or a
malformed cursor is a 400, never a driver error).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import uuid
from collections.abc import Callable
from datetime import datetime

from werkzeug.datastructures import MultiDict

# The queue name rule, handed on to the routes, which import no taskline.dispatch module.
from taskline.dispatch.keys import valid_queue_name as valid_queue_name
from taskline.jobs import Status
from taskline_producer.schemas.errors import InvalidParameter

DEFAULT_LIMIT = 50
MAX_LIMIT = 500
MAX_CURSOR_CHARS = 200
_DIGITS = re.compile(r"[0-9]{1,6}")

Position = tuple[datetime, uuid.UUID]


def encode_cursor(at: datetime, row_id: uuid.UUID) -> str:
    raw = json.dumps([at.isoformat(), str(row_id)], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(text: str | None) -> Position | None:
    """The position a cursor names, None when absent; InvalidParameter when it is not ours."""
    if text is None:
        return None
    try:
        if len(text) > MAX_CURSOR_CHARS:
            raise ValueError("too long")
        padded = text.encode("ascii") + b"=" * (-len(text) % 4)
        at, row_id = json.loads(base64.b64decode(padded, altchars=b"-_", validate=True))
        parsed = datetime.fromisoformat(at)
        if parsed.tzinfo is None:
            raise ValueError("naive timestamp")
        return parsed, uuid.UUID(row_id)
    except (ValueError, TypeError, AttributeError, binascii.Error, UnicodeError):
        raise InvalidParameter("cursor is not a cursor this API returned",
                               {"parameter": "cursor"}) from None


def limit(args: MultiDict[str, str], default: int = DEFAULT_LIMIT,
          most: int = MAX_LIMIT) -> int:
    raw = args.get("limit")
    if raw is None:
        return default
    if not _DIGITS.fullmatch(raw) or not 1 <= int(raw) <= most:
        raise InvalidParameter(f"limit must be an integer 1..{most}", {"parameter": "limit"})
    return int(raw)


def encode_id_cursor(row_id: uuid.UUID) -> str:
    """A cursor naming the last row of a page ordered by id alone."""
    return encode_name_cursor(str(row_id))


def encode_name_cursor(name: str) -> str:
    """A cursor naming the last row of a page ordered by name (a queue's, a schedule's)."""
    return base64.urlsafe_b64encode(name.encode()).decode().rstrip("=")


def decode_name_cursor(text: str | None, valid: Callable[[str], bool],
                       most_chars: int = MAX_CURSOR_CHARS) -> str | None:
    """The name a name cursor names, None when absent; InvalidParameter when it is not ours
    (longer than `most_chars`, or not base64url of a name `valid` accepts)."""
    if text is None:
        return None
    try:
        if len(text) > most_chars:
            raise ValueError("too long")
        padded = text.encode("ascii") + b"=" * (-len(text) % 4)
        name = base64.b64decode(padded, altchars=b"-_", validate=True).decode("ascii")
        if not valid(name):
            raise ValueError("not a name")
        return name
    except (ValueError, binascii.Error, UnicodeError):
        raise InvalidParameter("cursor is not a cursor this API returned",
                               {"parameter": "cursor"}) from None


def decode_id_cursor(text: str | None) -> uuid.UUID | None:
    """The id an id cursor names, None when absent; InvalidParameter when it is not ours."""
    name = decode_name_cursor(text, _is_uuid)
    return None if name is None else uuid.UUID(name)


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def status(args: MultiDict[str, str]) -> str | None:
    raw = args.get("status")
    if raw is not None and raw not in {s.value for s in Status}:
        raise InvalidParameter("status must be one of " + ", ".join(s.value for s in Status),
                               {"parameter": "status"})
    return raw


def queue(args: MultiDict[str, str]) -> str | None:
    raw = args.get("queue")
    if raw is not None and not valid_queue_name(raw):
        raise InvalidParameter("queue must be 1..64 characters of A-Z a-z 0-9 _ . : -",
                               {"parameter": "queue"})
    return raw


def tag(args: MultiDict[str, str]) -> str | None:
    raw = args.get("tag")
    if raw is not None and (not 1 <= len(raw) <= 100 or "\x00" in raw):
        raise InvalidParameter("tag must be 1..100 characters without NUL",
                               {"parameter": "tag"})
    return raw


def job_type(args: MultiDict[str, str]) -> str | None:
    raw = args.get("type")
    if raw is not None and (not 1 <= len(raw) <= 200 or "\x00" in raw):
        raise InvalidParameter("type must be 1..200 characters without NUL",
                               {"parameter": "type"})
    return raw
