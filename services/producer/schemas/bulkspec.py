"""Bulk dead-letter requests: a POST /api/v1/dlq/retry or /purge body as a filter and a limit.

Invariant: a BulkRequest matches at least one of queue, type, ids and fingerprint (combined
with AND), every value one PostgreSQL accepts as it is (a valid queue name, a type of 1..200
characters, 1..MAX UUIDs, a fingerprint of 16 hex digits), and a limit of 1..MAX_LIMIT;
anything else is a list of field errors and nothing runs. No I/O happens here.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

from taskline.dispatch.keys import valid_queue_name
from taskline.jobspec import MAX_TYPE_CHARS, FieldError
from taskline.store.store import DeadFilter

MAX_LIMIT = 10_000
FILTERS = ("queue", "type", "ids", "fingerprint")
FIELDS = frozenset({*FILTERS, "limit"})
_FINGERPRINT = re.compile(r"[0-9a-f]{16}")


@dataclass(frozen=True)
class BulkRequest:
    """Which dead jobs to act on, and at most how many."""

    match: DeadFilter
    limit: int

    def described(self) -> dict[str, object]:
        """The filter as the audit trail records it (ids counted, not listed)."""
        m = self.match
        return {"queue": m.queue, "type": m.type,
                "ids": None if m.ids is None else len(m.ids), "fingerprint": m.fingerprint,
                "limit": self.limit}


def parse_bulk(body: object) -> BulkRequest | list[FieldError]:
    if not isinstance(body, dict):
        return [FieldError("$", "the request body must be a JSON object")]
    errors = [FieldError(name, "unknown field") for name in body if name not in FIELDS]
    if not any(name in body for name in FILTERS):
        errors.append(FieldError("$", "give at least one of queue, type, ids, fingerprint"))
    errors += [FieldError(name, "must not be null; leave the field out to match any")
               for name in FILTERS if name in body and body[name] is None]
    queue, job_type, ids = body.get("queue"), body.get("type"), body.get("ids")
    if queue is not None and not valid_queue_name(queue):
        errors.append(FieldError("queue", "must be 1..64 characters of A-Z a-z 0-9 _ . : -"))
    if job_type is not None and not (isinstance(job_type, str)
                                     and 1 <= len(job_type) <= MAX_TYPE_CHARS
                                     and "\x00" not in job_type):
        errors.append(FieldError("type", f"must be a string of 1..{MAX_TYPE_CHARS} characters"))
    parsed_ids, id_errors = _ids(ids)
    limit, limit_errors = _limit(body.get("limit", MAX_LIMIT))
    cause = body.get("fingerprint")
    errors += id_errors + limit_errors + _fingerprint_errors(cause)
    if errors:
        return errors
    return BulkRequest(DeadFilter(queue, job_type, parsed_ids, cause), limit)


def _fingerprint_errors(value: object) -> list[FieldError]:
    if value is None or (isinstance(value, str) and _FINGERPRINT.fullmatch(value)):
        return []
    return [FieldError("fingerprint", "must be a group's fingerprint: 16 hex digits "
                                      "(GET /api/v1/dlq/groups)")]


def _ids(value: object) -> tuple[tuple[uuid.UUID, ...] | None, list[FieldError]]:
    if value is None:
        return None, []
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_LIMIT:
        return None, [FieldError("ids", f"must be an array of 1..{MAX_LIMIT} job ids")]
    parsed = []
    for item in value:
        try:
            parsed.append(uuid.UUID(item) if isinstance(item, str) else None)
        except ValueError:
            parsed.append(None)
    if None in parsed:
        return None, [FieldError("ids", "every id must be a job id (a UUID string)")]
    return tuple(p for p in parsed if p is not None), []


def _limit(value: object) -> tuple[int, list[FieldError]]:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LIMIT:
        return 0, [FieldError("limit", f"must be an integer 1..{MAX_LIMIT}")]
    return value, []
