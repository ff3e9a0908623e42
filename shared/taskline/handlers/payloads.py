"""Payload models of declared job types: validate a JSON payload into the declared type, dump
an instance back to JSON, and publish the type's JSON Schema.

One validator serves every kind a `@handler(payload=...)` accepts (a pydantic model, a
dataclass, a TypedDict): pydantic's `TypeAdapter`, from the optional extra
`taskline[pydantic]`. It builds nested instances, coerces what JSON cannot carry (datetimes,
UUIDs) both ways and writes the JSON Schema the API checks payloads against, so what a worker
accepts and what the API accepts come from one description of the type. Without pydantic,
handlers without `payload=` work as before and a declaration with one says what to install.

Invariant: `validate(dump(x))` gives back an equal `x`, and `dump` yields only what
PostgreSQL's jsonb stores.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Generic, TypeVar

# typing_extensions' check knows both TypedDicts (typing's and its own, which pydantic needs
# before Python 3.12); SQLAlchemy already depends on it.
from typing_extensions import is_typeddict

from taskline.errors import InvalidJob

T = TypeVar("T")
INSTALL_HINT = "declared payloads need pydantic: pip install 'taskline[pydantic]'"


class PayloadModel(Generic[T]):
    """The validator, dumper and JSON Schema of one payload type."""

    def __init__(self, model: type[T]) -> None:
        refusal = kind_problem(model)
        if refusal is not None:
            raise TypeError(f"payload={model!r}: {refusal}")
        try:
            from pydantic import PydanticUserError, TypeAdapter, ValidationError
        except ImportError:
            raise ImportError(f"payload={model.__name__}: {INSTALL_HINT}") from None
        self.model = model
        try:
            self._adapter: Any = TypeAdapter(model)
            self.schema: dict[str, Any] = self._adapter.json_schema()
        except PydanticUserError as err:  # a field type with no JSON form, typing.TypedDict ...
            raise TypeError(f"payload={model.__name__}: {err}") from None
        # pydantic-core's compiled validator, bound once (built by json_schema() above): a
        # worker validates every declared job's payload, and TypeAdapter.validate_python adds
        # a Python call with eight keyword arguments in front of it; no import per call.
        self._validate_python: Any = self._adapter.validator.validate_python
        self._invalid: Any = ValidationError

    def validate(self, payload: Any, field: str = "payload") -> T:
        """`payload` (JSON, or an instance of the model) as the model; InvalidJob naming each
        bad field (`payload.address.zip`) otherwise."""
        try:
            return self._validate_python(payload)  # type: ignore[no-any-return]
        except self._invalid as err:
            raise InvalidJob([{"field": _location(field, e["loc"]), "message": e["msg"]}
                              for e in err.errors()]) from None

    def dump(self, payload: Any, field: str = "payload") -> Any:
        """`payload` validated, then as the JSON the job stores (defaults filled in)."""
        return self._adapter.dump_python(self.validate(payload, field), mode="json")


def kind_problem(model: object) -> str | None:
    """Why `model` cannot be a declared payload type (None when it can)."""
    if not isinstance(model, type):
        return "must be a class: a pydantic model, a dataclass or a TypedDict"
    if dataclasses.is_dataclass(model) or is_typeddict(model) or _is_pydantic_model(model):
        return None
    return (f"{model.__name__} is not a pydantic model, a dataclass or a TypedDict "
            "(a payload is a JSON object with named fields)")


def _is_pydantic_model(model: type) -> bool:
    # Looked up by name so that checking needs no pydantic import when it is absent.
    return any(base.__module__.startswith("pydantic") and base.__name__ == "BaseModel"
               for base in model.__mro__)


def _location(field: str, loc: tuple[Any, ...]) -> str:
    """`payload.items[2].sku` from pydantic's ("items", 2, "sku")."""
    text = field
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text
