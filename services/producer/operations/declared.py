"""Declared job types in the API: payloads checked against their type's schemas before a
job is written (GET /api/v1/types, which lists them, is taskline_producer.routes.jobtypes).

Invariant: a job of a type some worker seen within TASKLINE_TYPE_TTL_S declared is accepted
only when its payload satisfies at least one schema declared for that type (so both shapes
pass while a changed schema rolls out); under TASKLINE_UNKNOWN_TYPES=reject a type no such
worker declared is refused. Both refusals happen before anything is written. The declared
schemas are read from PostgreSQL at most once per REFRESH_S per process, each compiled once,
so an undeclared type costs one dictionary lookup and a declared one a validation.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from jsonschema import Draft202012Validator, ValidationError

from taskline.errors import StoreUnavailable
from taskline.jobspec import FieldError
from taskline.metrics import OTHER, PAYLOAD_REFUSED, LabelGuard
from taskline.settings import Settings
from taskline.store.views import ApiStore

log = logging.getLogger(__name__)

REFRESH_S = 5.0
"""How stale this process's copy of the declared schemas may be: a worker's new schema is
enforced by every API process within this long of its start."""
MAX_ERRORS = 10
"""Field errors reported for one payload; a payload far off its schema need not list all."""

_ANY = None
"""A declaration without a payload type: every payload fits it."""


class Declarable(Protocol):
    """What is checked of a job: a JobSpec, or a workflow step's StepJob."""

    @property
    def type(self) -> str: ...

    @property
    def payload(self) -> Any: ...


@dataclass(frozen=True)
class Checked:
    """A job known by its type and payload only (a schedule's job)."""

    type: str
    payload: Any


class DeclaredTypes:
    """This process's cached view of the declared types: type -> compiled schema validators."""

    def __init__(self, store: ApiStore, settings: Settings, refresh_s: float = REFRESH_S) -> None:
        self._store = store
        self._ttl_s = settings.type_ttl_s
        self._reject_unknown = settings.unknown_types == "reject"
        self._refresh_s = refresh_s
        self._lock = threading.Lock()
        self._by_type: dict[str, list[Draft202012Validator | None]] | None = None
        self._compiled: dict[str, Draft202012Validator] = {}
        self._read_at = 0.0
        self._labels = LabelGuard()

    def errors(self, specs: Sequence[Declarable],
               where: Callable[[int], str] = lambda index: "") -> list[FieldError]:
        """Field errors of the jobs whose payload breaks their declared type (or whose type is
        undeclared, under reject); `where(i)` prefixes the fields of the i-th (`jobs[2].`)."""
        declared = self._current()
        if not declared and not self._reject_unknown:
            return []  # no type declared: an enqueue pays no loop over its jobs
        problems: list[FieldError] = []
        for index, spec in enumerate(specs):
            validators = declared.get(spec.type)
            if validators is None:
                if self._reject_unknown:
                    PAYLOAD_REFUSED.labels(OTHER, "undeclared").inc()
                    problems.append(FieldError(f"{where(index)}type", (
                        f"no worker seen within TASKLINE_TYPE_TTL_S declares type {spec.type!r} "
                        "(TASKLINE_UNKNOWN_TYPES=reject)")))
                continue
            misfit = _payload_errors(validators, spec.payload, f"{where(index)}payload")
            if misfit:
                PAYLOAD_REFUSED.labels(self._labels(spec.type), "schema").inc()
            problems += misfit
        return problems

    def _current(self) -> dict[str, list[Draft202012Validator | None]]:
        """The declared schemas, read again when older than `refresh_s`. One request reads
        while the others keep using the previous copy; with PostgreSQL unreachable the
        previous copy stays in force (the write that follows would fail anyway)."""
        now = time.monotonic()
        known = self._by_type
        if known is not None and now - self._read_at < self._refresh_s:
            return known
        if known is not None and not self._lock.acquire(blocking=False):
            return known
        if known is None:
            self._lock.acquire()
        try:
            if self._by_type is None or time.monotonic() - self._read_at >= self._refresh_s:
                self._read()
            return self._by_type or {}
        finally:
            self._lock.release()

    def _read(self) -> None:
        try:
            schemas = self._store.declared_schemas(self._ttl_s)
        except StoreUnavailable:
            if self._by_type is None:
                raise
            # Tried again after refresh_s, not by every request of an outage.
            self._read_at = time.monotonic()
            log.debug("declared types not refreshed: PostgreSQL unreachable")
            return
        self._by_type = {name: [self._validator(s) for s in found]
                         for name, found in schemas.items()}
        self._read_at = time.monotonic()

    def _validator(self, schema: Any) -> Draft202012Validator | None:
        if schema is _ANY:
            return None
        key = json.dumps(schema, sort_keys=True)
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = self._compiled[key] = Draft202012Validator(schema)
        return compiled


def _payload_errors(validators: list[Draft202012Validator | None], payload: Any,
                    field: str) -> list[FieldError]:
    """None when `payload` fits any validator; else the errors of the one it comes closest to."""
    closest: list[FieldError] | None = None
    for validator in validators:
        if validator is None:
            return []
        found = [FieldError(_field(field, e), e.message) for e in validator.iter_errors(payload)]
        if not found:
            return []
        if closest is None or len(found) < len(closest):
            closest = found
    return (closest or [])[:MAX_ERRORS]


def _field(field: str, error: ValidationError) -> str:
    """The field an error is about; a missing property is named itself, not its object."""
    path = _path(field, error.absolute_path)
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [name for name in error.validator_value
                   if name not in error.instance and repr(name) in error.message]
        if missing:
            return f"{path}.{missing[0]}"
    return path


def _path(field: str, parts: Sequence[Any]) -> str:
    """`payload.items[2].sku` from jsonschema's deque ("items", 2, "sku")."""
    for part in parts:
        field += f"[{part}]" if isinstance(part, int) else f".{part}"
    return field
