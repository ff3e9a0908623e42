"""Job specs: pure functions turning a parsed JSON body into a validated spec or field errors.

The one validation of a job request: the API (POST /api/v1/jobs and /jobs/batch) and the
library's in-transaction `taskline.enqueue` both parse through `parse_job`, so a job the one
refuses the other refuses too, with the same field errors.

Invariant: a JobSpec holds only values PostgreSQL accepts as they are (types 1..200 characters,
valid queue names, priorities 0..9, finite bounded numbers, UTC datetimes), so the insert that
follows cannot fail on input; every rule here is mirrored in openapi.json. An idempotency key
is 1..255 visible ASCII characters wherever it travels: the Idempotency-Key header carries it
as the IETF draft's sf-string (`"order-1"`, unquoted here) or bare (`order-1`), the body as a
JSON string, and each way names the same job. No I/O happens here.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from taskline.dispatch.keys import valid_queue_name
from taskline.jobs import PRIORITY_NAMES, parse_priority
from taskline.settings import Settings
from taskline.uniquespec import DebounceSpec, UniqueSpec, parse_debounce, parse_unique

MAX_TYPE_CHARS = 200
MAX_LIMIT_KEY_CHARS = 200
MAX_TAGS = 20
MAX_TAG_CHARS = 100
MAX_KEY_CHARS = 255
MAX_TIMEOUT_S = 86_400.0
MAX_DELAY_S = 365 * 86_400.0
MAX_RETRIES = 100
MAX_BATCH = 1000
FIELDS = frozenset({"type", "payload", "queue", "priority", "max_retries", "timeout_s",
                    "delay_s", "run_at", "idempotency_key", "limit_key", "unique", "debounce",
                    "ordering_key", "tags", "expires_at", "start_within_s"})
# Kept a day inside Python's calendar, so a datetime read back in any session time zone fits.
_EARLIEST = datetime(1, 1, 2, tzinfo=UTC)
_LATEST = datetime(9999, 12, 30, tzinfo=UTC)
# ASCII digits only: \d also matches full-width and other Unicode digits, which RFC 3339 refuses.
_RFC3339 = re.compile(r"(\d{4})-(\d\d)-(\d\d)[Tt ](\d\d):(\d\d):(\d\d)(\.\d+)?"
                      r"(?:([Zz])|([+-])(\d\d):(\d\d))", re.ASCII)
KEY_CODE = "invalid_idempotency_key"
_KEY = re.compile(rf"[!-~]{{1,{MAX_KEY_CHARS}}}")
_BARE_KEY = re.compile(rf'[!#-\[\]-~]{{1,{MAX_KEY_CHARS}}}')  # visible ASCII but " and \\
_SF_STRING = re.compile(r'"((?:[ !#-\[\]-~]|\\["\\])*)"')
_SF_ESCAPE = re.compile(r'\\(["\\])')


class InvalidKey(ValueError):
    """An idempotency key that breaks the one rule (answered 400, not 422)."""


@dataclass(frozen=True)
class FieldError:
    """One invalid field: where it is (`type`, `jobs[3].priority`) and what is wrong."""

    field: str
    message: str
    code: str | None = None
    """KEY_CODE for an idempotency key that breaks the key rule; None for other errors."""

    def to_dict(self) -> dict[str, str]:
        return {"field": self.field, "message": self.message}


@dataclass(frozen=True)
class JobSpec:
    """A validated request to enqueue one job."""

    type: str
    payload: Any
    queue: str
    priority: int
    max_retries: int
    timeout_s: float
    delay_s: float
    run_at: datetime | None
    idempotency_key: str | None
    request_hash: str | None  # None for a job without an idempotency key
    limit_key: str | None = None
    unique: UniqueSpec | None = None
    """taskline.uniqueness: at most one job of the queue holds this key in its scope."""
    debounce: DebounceSpec | None = None
    """taskline.uniqueness: arrivals with this key join the job waiting out its delay."""
    ordering_key: str | None = None
    tags: tuple[str, ...] | None = None
    expires_at: datetime | None = None
    start_within_s: float | None = None

    @property
    def keyed(self) -> bool:
        """Written under a per-key lock (taskline.uniqueness), never by the plain inserts."""
        return self.unique is not None or self.debounce is not None


def parse_job(body: object, settings: Settings,
              header_key: str | None = None) -> JobSpec | list[FieldError]:
    """Validate one job request; `header_key` is the Idempotency-Key header, if sent."""
    if not isinstance(body, dict):
        return [FieldError("$", "the request body must be a JSON object")]
    values: dict[str, Any] = {}
    errors = [FieldError(name, "unknown field") for name in body if name not in FIELDS]
    for name, value in body.items():
        if name in _PARSERS:
            try:
                values[name] = _PARSERS[name](value)
            except ValueError as err:
                errors.append(_field_error(name, err))
    header, header_errors = _header_key(header_key)
    errors += header_errors + _cross_field_errors(body, values, header)
    if "unique" in body or "debounce" in body:  # a plain job pays for neither
        errors += _semantics(body, values, header)
    if errors:
        return errors
    # Only a replay compares the hash, and only a job with a key can be replayed.
    keyed = values.get("idempotency_key", header) is not None
    return _spec(values, settings, header, request_hash(body) if keyed else None)


def _semantics(body: dict[str, Any], values: dict[str, Any],
               header_key: str | None) -> list[FieldError]:
    """`unique` and `debounce` parsed into `values`; the combinations the contract refuses."""
    errors: list[FieldError] = []
    if "unique" in body:
        unique = parse_unique(body["unique"], body.get("type"), body.get("payload"))
        if isinstance(unique, UniqueSpec):
            values["unique"] = unique
        else:
            errors += [FieldError(f"unique{p.path}", p.message) for p in unique]
    if "debounce" not in body:
        return errors
    debounce = parse_debounce(body["debounce"])
    if isinstance(debounce, DebounceSpec):
        values["debounce"] = debounce
    else:
        errors += [FieldError(f"debounce{p.path}", p.message) for p in debounce]
    if "unique" in body:
        errors.append(FieldError("debounce", "give debounce or unique, not both"))
    if "idempotency_key" in body or header_key is not None:
        errors.append(FieldError("debounce", "a debounced job takes no idempotency key"))
    if "delay_s" in body or "run_at" in body:
        errors.append(FieldError("debounce", "a debounced job runs debounce.delay_s after its "
                                             "last arrival: give no delay_s or run_at"))
    return errors


def key_from_header(raw: str) -> str:
    """The key an Idempotency-Key header names: an sf-string unquoted, or a bare key."""
    quoted = _SF_STRING.fullmatch(raw)
    if quoted:
        return _key(_SF_ESCAPE.sub(r"\1", quoted.group(1)))
    if not _BARE_KEY.fullmatch(raw):
        raise InvalidKey(f"must be a quoted string (sf-string) or 1..{MAX_KEY_CHARS} visible "
                         'ASCII characters other than " and \\')
    return raw


def _header_key(raw: str | None) -> tuple[str | None, list[FieldError]]:
    if raw is None:
        return None, []
    try:
        return key_from_header(raw), []
    except ValueError as err:
        return None, [_field_error("Idempotency-Key", err)]


def _field_error(name: str, err: ValueError) -> FieldError:
    return FieldError(name, str(err), KEY_CODE if isinstance(err, InvalidKey) else None)


def parse_batch(body: object, settings: Settings) -> list[JobSpec] | list[FieldError]:
    """Validate `{"jobs": [...]}`; errors name the index of the item they belong to."""
    if not isinstance(body, dict):
        return [FieldError("$", "the request body must be a JSON object")]
    errors = [FieldError(name, "unknown field") for name in body if name != "jobs"]
    items = body.get("jobs")
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_BATCH:
        return [*errors, FieldError("jobs", f"must be an array of 1..{MAX_BATCH} jobs")]
    specs: list[JobSpec] = []
    for index, item in enumerate(items):
        parsed = parse_job(item, settings)
        if isinstance(parsed, JobSpec):
            specs.append(parsed)
        else:
            errors += [FieldError(f"jobs[{index}].{e.field}".replace(".$", ""), e.message)
                       for e in parsed]
    return errors or specs


def request_hash(body: dict[str, Any]) -> str:
    """SHA-256 of the canonical body (sorted keys, no idempotency key): what a replay must match."""
    canonical = {k: v for k, v in body.items() if k != "idempotency_key"}
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _spec(values: dict[str, Any], settings: Settings, header_key: str | None,
          digest: str | None) -> JobSpec:
    # `values` is keyed by JobSpec's field names: the body's fields over the defaults. Set in
    # one dict update, as Job.of does, skipping the frozen __init__'s setattr per field.
    fields = {"payload": {}, "queue": "default", "priority": 5,
              "max_retries": settings.default_max_retries,
              "timeout_s": settings.default_timeout_s, "delay_s": 0.0, "run_at": None,
              "idempotency_key": header_key, **values, "request_hash": digest}
    debounce: DebounceSpec | None = values.get("debounce")
    if debounce is not None:
        # A debounced job starts scheduled, due its delay after its first arrival.
        fields["delay_s"] = debounce.delay_s
    spec = object.__new__(JobSpec)
    spec.__dict__.update(fields)
    return spec


def _cross_field_errors(body: dict[str, Any], values: dict[str, Any],
                        header_key: str | None) -> list[FieldError]:
    errors = []
    if "type" not in body:
        errors.append(FieldError("type", "required"))
    if "delay_s" in body and "run_at" in body:
        errors.append(FieldError("run_at", "give delay_s or run_at, not both"))
    if "expires_at" in body and "start_within_s" in body:
        errors.append(FieldError("start_within_s", "give expires_at or start_within_s, not both"))
    expires = values.get("expires_at")
    # The API host's clock, so a bad request costs no database read: within the hosts' skew a
    # value is refused early or accepted and then lapsed; the claim judges in PostgreSQL's
    # clock, so an accepted past value is never leased (docs/api.md, `expires_at`).
    if expires is not None and expires <= datetime.now(UTC):
        errors.append(FieldError("expires_at", "is in the past: the job could never start"))
    body_key = values.get("idempotency_key")
    if header_key is not None and body_key is not None and body_key != header_key:
        errors.append(FieldError("idempotency_key", "differs from the Idempotency-Key header"))
    return errors


def _text(value: object, limit: int) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= limit:
        raise ValueError(f"must be a string of 1..{limit} characters")
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    return value


def _type(value: object) -> str:
    return _text(value, MAX_TYPE_CHARS)


def _key(value: object) -> str:
    if not isinstance(value, str) or not _KEY.fullmatch(value):
        raise InvalidKey(f"must be 1..{MAX_KEY_CHARS} visible ASCII characters (! to ~)")
    return value


def _limit_key(value: object) -> str:
    return _text(value, MAX_LIMIT_KEY_CHARS)


def _tags(value: object) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or len(value) > MAX_TAGS:
        raise ValueError(f"must be an array of at most {MAX_TAGS} strings")
    try:
        tags = [_text(tag, MAX_TAG_CHARS) for tag in value]
    except ValueError as err:
        raise ValueError(f"each tag {err}") from None
    return tuple(dict.fromkeys(tags))  # a tag given twice is kept once, in first place


def _payload(value: object) -> object:
    if value is None:
        raise ValueError("must be a JSON value other than null")
    return value


def _queue(value: object) -> str:
    if not valid_queue_name(value):
        raise ValueError("must be 1..64 characters of A-Z a-z 0-9 _ . : -")
    return str(value)


def _integral(value: object) -> object:
    """JSON does not tell 3 from 3.0 (JSON Schema calls both integers); booleans stay apart."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _priority(value: object) -> int:
    if isinstance(value, str) and value not in PRIORITY_NAMES:
        raise ValueError("must be an integer 0..9 or one of low, normal, high, critical")
    return parse_priority(_integral(value))


def _max_retries(value: object) -> int:
    value = _integral(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_RETRIES:
        raise ValueError(f"must be an integer 0..{MAX_RETRIES}")
    return value


def _number(value: object, low: float, high: float, *, low_open: bool) -> float:
    """A finite number in [low, high] (or (low, high] when `low_open`); booleans are not numbers."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be a number")
    too_low = value <= low if low_open else value < low
    if too_low or value > high or not math.isfinite(value):
        bracket = "(" if low_open else "["
        raise ValueError(f"must be a number in {bracket}{low:g}, {high:g}]")
    return float(value)


def _timeout(value: object) -> float:
    return _number(value, 0.0, MAX_TIMEOUT_S, low_open=True)


def _delay(value: object) -> float:
    return _number(value, 0.0, MAX_DELAY_S, low_open=False)


def _within(value: object) -> float:
    return _number(value, 0.0, MAX_DELAY_S, low_open=True)


def _run_at(value: object) -> datetime:
    if not isinstance(value, str):
        raise ValueError("must be an ISO 8601 date-time string with a timezone")
    parsed = parse_datetime(value)
    if parsed is None:
        raise ValueError("must be an ISO 8601 date-time with a timezone, e.g. "
                         "2030-01-01T12:00:00Z")
    return parsed


def parse_datetime(text: str) -> datetime | None:
    """An aware UTC datetime from RFC 3339 (ASCII digits, calendar dates); else None.

    Instants outside 0001-01-02 .. 9999-12-30 are moved to the nearer bound: a time that early is
    simply due, and one that late is as good as never.
    """
    match = _RFC3339.fullmatch(text)
    if match is None:  # week dates, ordinal dates, basic format: ISO 8601, not RFC 3339
        return None
    try:
        parsed = _from_rfc3339(match)
    except ValueError:
        return None
    except OverflowError:  # only a leap second at the very end of year 9999 gets here
        return _LATEST
    if parsed.tzinfo is None:
        return None
    try:
        utc = parsed.astimezone(UTC)
    except OverflowError:
        return _EARLIEST if parsed.year == 1 else _LATEST
    return min(max(utc, _EARLIEST), _LATEST)


def _from_rfc3339(match: re.Match[str]) -> datetime:
    """RFC 3339, including a leap second (23:59:60 is read as the instant after :59).

    Year 0000 (valid in RFC 3339, not in Python) is read as the earliest instant: long due.
    """
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    if year == 0:
        return _EARLIEST
    micro = int((match.group(7) or ".")[1:7].ljust(6, "0"))
    offset = timedelta(0)
    if not match.group(8):
        if int(match.group(11)) > 59:
            raise ValueError("offset minutes must be 00..59")
        sign = -1 if match.group(9) == "-" else 1
        offset = sign * timedelta(hours=int(match.group(10)), minutes=int(match.group(11)))
    leap = second == 60
    parsed = datetime(year, month, day, hour, minute, 59 if leap else second, micro,
                      tzinfo=timezone(offset))
    return parsed + timedelta(seconds=1) if leap else parsed


_PARSERS: dict[str, Callable[[Any], Any]] = {
    "type": _type, "payload": _payload, "queue": _queue, "priority": _priority,
    "max_retries": _max_retries, "timeout_s": _timeout, "delay_s": _delay, "run_at": _run_at,
    "idempotency_key": _key, "limit_key": _limit_key, "ordering_key": _limit_key,
    "tags": _tags, "expires_at": _run_at, "start_within_s": _within,
}
