"""The `unique` and `debounce` fields of a job request: pure parsing into specs or field errors.

`unique` makes an enqueue return (or replace) the job of the same queue that already holds its
key in the states and period it names; `debounce` makes arrivals with one key, queue and type
join the job still waiting out its delay (taskline.uniqueness writes both). Both are checked
here, before anything is written, with errors naming the field (`unique.states[2]`), and
taskline.jobspec refuses the combinations the contract forbids (debounce with unique or an
idempotency key). No I/O.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from taskline.jobs import Status

MAX_KEY_CHARS = 255
MAX_PERIOD_S = 100 * 365 * 86_400.0
MAX_DEBOUNCE_DELAY_S = 86_400.0
DEBOUNCE_SPAN = 10
"""A debounced job runs at most this many times its delay_s after its first arrival."""
MAX_COALESCED = 1000
"""Payloads one debounced job holds at most; the next arrival begins a new job."""
UNFINISHED = tuple(s.value for s in Status if not s.terminal)
"""A unique key's default `states`: every unfinished state, in Status order."""
ON_CONFLICT = ("return", "replace")
_UNIQUE_FIELDS = frozenset({"key", "period_s", "states", "on_conflict"})
_DEBOUNCE_FIELDS = frozenset({"key", "delay_s"})


@dataclass(frozen=True)
class UniqueSpec:
    """At most one job of a queue holds `key` in `states` created within `period_s`."""

    key: str
    period_s: float | None  # None: for ever
    states: tuple[str, ...]
    replace: bool


@dataclass(frozen=True)
class DebounceSpec:
    """Arrivals with `key` (per queue and type) join the job waiting out its delay."""

    key: str
    delay_s: float


@dataclass(frozen=True)
class Problem:
    """One invalid part of the field: its path below `unique` / `debounce` and why."""

    path: str
    message: str


def parse_unique(value: object, job_type: object, payload: object) -> UniqueSpec | list[Problem]:
    """`unique` of a request; the default key is the type with the canonical payload."""
    if not isinstance(value, dict):
        return [Problem("", "must be an object of key, period_s, states, on_conflict")]
    problems = [Problem(f".{name}", "unknown field") for name in value if name not in
                _UNIQUE_FIELDS]
    key = _key(value.get("key"), problems) if "key" in value else default_key(job_type, payload)
    period = (_positive(value["period_s"], MAX_PERIOD_S, ".period_s", problems)
              if value.get("period_s") is not None else None)
    states = _states(value.get("states", list(UNFINISHED)), problems)
    on_conflict = value.get("on_conflict", "return")
    if not isinstance(on_conflict, str) or on_conflict not in ON_CONFLICT:
        problems.append(Problem(".on_conflict", 'must be "return" or "replace"'))
    if problems:
        return problems
    return UniqueSpec(key, period, states, on_conflict == "replace")


def parse_debounce(value: object) -> DebounceSpec | list[Problem]:
    """`debounce` of a request: both a key and a delay are required."""
    if not isinstance(value, dict):
        return [Problem("", "must be an object of key and delay_s")]
    problems = [Problem(f".{name}", "unknown field") for name in value if name not in
                _DEBOUNCE_FIELDS]
    key = _key(value.get("key"), problems)
    delay = _positive(value.get("delay_s"), MAX_DEBOUNCE_DELAY_S, ".delay_s", problems)
    return problems or DebounceSpec(key, delay)


def unique_lock(queue: str, key: str) -> str:
    """The text whose hash is the transaction lock of a unique key (its stored, scoped form)
    in `queue`: the same for every way in, a schedule's slots included."""
    return f"unique\x1f{queue}\x1f{key}"


def default_key(job_type: object, payload: object) -> str:
    """`<type>:<sha256 of the canonical payload>`: the same job asked for twice."""
    canonical = json.dumps(payload if payload is not None else {}, sort_keys=True,
                           separators=(",", ":"), ensure_ascii=False, default=str)
    digest = hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{job_type}:{digest}"[-MAX_KEY_CHARS:] if isinstance(job_type, str) else digest


def _key(value: object, problems: list[Problem]) -> str:
    # Control characters are refused: the principal's scope is joined to the key with one.
    if (not isinstance(value, str) or not 1 <= len(value) <= MAX_KEY_CHARS
            or any(ord(c) < 32 or c == "\x7f" for c in value)):
        problems.append(Problem(".key", f"must be a string of 1..{MAX_KEY_CHARS} characters "
                                        "without control characters"))
        return ""
    return value


def _positive(value: object, high: float, path: str, problems: list[Problem]) -> float:
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or not 0 < value <= high):
        problems.append(Problem(path, f"must be a number in (0, {high:g}]"))
        return 0.0
    return float(value)


def _states(value: object, problems: list[Problem]) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        problems.append(Problem(".states", "must be a non-empty array of job states"))
        return ()
    known = {s.value for s in Status}
    for index, state in enumerate(value):
        if not isinstance(state, str) or state not in known:
            problems.append(Problem(f".states[{index}]",
                                    f"unknown state {str(state)[:50]!r}; one of "
                                    f"{', '.join(sorted(known))}"))
    return tuple(dict.fromkeys(s for s in value if isinstance(s, str) and s in known))


def as_json(spec: UniqueSpec | DebounceSpec | None) -> dict[str, Any] | None:
    """The field as a request names it (what a schedule's or a client's body holds)."""
    if isinstance(spec, UniqueSpec):
        return {"key": spec.key, "period_s": spec.period_s, "states": list(spec.states),
                "on_conflict": "replace" if spec.replace else "return"}
    if isinstance(spec, DebounceSpec):
        return {"key": spec.key, "delay_s": spec.delay_s}
    return None
