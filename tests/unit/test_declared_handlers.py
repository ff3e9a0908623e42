"""`@handler` declarations, without I/O: payload kinds (pydantic model, dataclass, TypedDict)
validated into instances and dumped to JSON, bad declarations refused at import naming the
argument, a second registration of a type refused naming both modules, and the worker's call
(`Handler.run`) handing the function a validated instance or failing without retries."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
from pydantic import BaseModel, ConfigDict
from typing_extensions import TypedDict

from taskline.errors import InvalidJob, NonRetryableError
from taskline.handlers import registry, serving
from taskline.handlers.declared import InvalidPayload
from taskline.handlers.payloads import PayloadModel


class Line(BaseModel):
    sku: str
    count: int = 1


class Order(BaseModel):
    id: int
    lines: list[Line]
    at: datetime


@dataclass
class Resize:
    image: str
    width: int = 640


class Ping(TypedDict):
    host: str


def ctx(job_type: str) -> registry.JobContext:
    return registry.JobContext(job_id=uuid.uuid4(), attempt=1, queue="default", type=job_type,
                               worker_id="w")


@pytest.fixture
def types() -> Iterator[list[str]]:
    """Types a test registers, forgotten after it."""
    made: list[str] = []
    yield made
    for name in made:
        registry._registry.pop(name, None)


def test_each_payload_kind_validates_into_an_instance_and_dumps_to_json() -> None:
    order = PayloadModel(Order)
    value = order.validate({"id": 1, "lines": [{"sku": "a"}], "at": "2030-01-01T00:00:00Z"})
    assert isinstance(value, Order) and value.lines[0].count == 1
    assert order.dump(value) == {"id": 1, "lines": [{"sku": "a", "count": 1}],
                                 "at": "2030-01-01T00:00:00Z"}
    assert order.dump(Order(id=2, lines=[], at=datetime(2030, 1, 1, tzinfo=UTC)))["id"] == 2
    assert PayloadModel(Resize).validate({"image": "a.png"}) == Resize("a.png", 640)
    assert PayloadModel(Resize).dump(Resize("b.png", 10)) == {"image": "b.png", "width": 10}
    assert PayloadModel(Ping).validate({"host": "db1"}) == {"host": "db1"}
    assert PayloadModel(Ping).schema["required"] == ["host"]


class Deferred(BaseModel):
    """A model whose validator pydantic builds only when first needed."""

    model_config = ConfigDict(defer_build=True)
    size: int


def test_a_model_built_late_validates_and_names_a_bad_field() -> None:
    deferred = PayloadModel(Deferred)
    assert deferred.validate({"size": "3"}) == Deferred(size=3)
    with pytest.raises(InvalidJob) as caught:
        deferred.validate({"size": "big"})
    assert [e["field"] for e in caught.value.errors] == ["payload.size"]


@dataclass
class Unjsonable:
    lock: type(threading.Lock())  # type: ignore[valid-type]


def test_a_model_whose_fields_have_no_json_form_is_refused_naming_the_argument() -> None:
    with pytest.raises(TypeError, match=r"^payload=Unjsonable: "):
        registry.handler("t.bad", payload=Unjsonable)
    assert registry.get("t.bad") is None


def test_a_payload_error_names_the_field_inside_it() -> None:
    with pytest.raises(InvalidJob) as caught:
        PayloadModel(Order).validate({"id": "x", "lines": [{"sku": "a"}, {"count": 2}],
                                      "at": "2030-01-01T00:00:00Z"})
    fields = [e["field"] for e in caught.value.errors]
    assert fields == ["payload.id", "payload.lines[1].sku"]


@pytest.mark.parametrize("bad", [int, dict, "Order", Order(id=1, lines=[], at=datetime.now(UTC))])
def test_a_payload_that_is_not_a_model_is_refused_naming_the_argument(bad: object) -> None:
    with pytest.raises(TypeError, match=r"^payload="):
        registry.handler("t.bad", payload=bad)  # type: ignore[call-overload]
    assert registry.get("t.bad") is None


@pytest.mark.parametrize(("arguments", "named"), [
    ({"queue": "no spaces"}, "queue="), ({"priority": 12}, "priority="),
    ({"priority": "urgent"}, "priority="), ({"max_retries": -1}, "max_retries="),
    ({"timeout_s": 0}, "timeout_s=")])
def test_bad_defaults_are_refused_at_import_naming_the_argument(arguments: dict[str, object],
                                                                named: str) -> None:
    with pytest.raises(ValueError, match=named):
        registry.handler("t.bad", **arguments)  # type: ignore[call-overload]


def test_a_function_that_cannot_take_payload_and_ctx_is_refused(types: list[str]) -> None:
    def no_ctx(payload: object) -> None: ...

    def keyword_only(payload: object, *, ctx: object) -> None: ...

    def three(payload: object, ctx: object, extra: object) -> None: ...

    for fn in (no_ctx, keyword_only, three):
        with pytest.raises(TypeError, match="cannot be called as \\(payload, ctx\\)"):
            registry.handler("t.sig")(fn)  # type: ignore[arg-type]
    assert registry.get("t.sig") is None

    def flexible(*args: object, extra: int = 1) -> None: ...

    types.append("t.sig")
    registry.handler("t.sig")(flexible)  # extra positional and defaulted arguments are fine


def test_a_second_registration_of_a_type_raises_naming_both_modules(types: list[str]) -> None:
    types.append("t.twice")
    first = registry.handler("t.twice")(lambda payload, ctx: 1)
    other = type(lambda: None)(first.fn.__code__, {"__name__": "elsewhere.jobs"}, "handle")
    other.__module__ = "elsewhere.jobs"
    with pytest.raises(ValueError) as caught:
        registry.handler("t.twice")(other)
    assert f"in module {__name__}" in str(caught.value)
    assert "in module elsewhere.jobs" in str(caught.value)
    assert registry.get("t.twice") is first
    again = registry.handler("t.twice")(first.fn)  # the same function again: a reload
    assert registry.get("t.twice") is again


def test_the_worker_call_passes_the_instance_and_refuses_a_misfit(types: list[str]) -> None:
    types.append("t.resize")
    seen: list[object] = []

    @registry.handler("t.resize", payload=Resize, queue="images", priority="high")
    def resize(payload: Resize, ctx: registry.JobContext) -> int:
        seen.append(payload)
        return payload.width

    assert resize.run({"image": "a.png", "width": 3}, ctx("t.resize")) == 3
    assert seen == [Resize("a.png", 3)]
    with pytest.raises(InvalidPayload) as caught:
        resize.run({"width": "wide"}, ctx("t.resize"))
    assert isinstance(caught.value, NonRetryableError)
    assert "payload.image" in str(caught.value) and "payload.width" in str(caught.value)
    assert resize(Resize("direct.png"), ctx("t.resize")) == 640  # still callable directly
    assert (resize.queue, resize.defaults.priority) == ("images", "high")


def test_a_worker_serves_every_registered_type_with_its_schema(types: list[str]) -> None:
    types += ["t.ping", "t.free"]
    registry.handler("t.ping", payload=Ping, queue="pings")(lambda payload, ctx: None)
    registry.handler("t.free")(lambda payload, ctx: None)
    by_type = {t["type"]: t for t in serving.served()}
    assert by_type["t.ping"] == {"type": "t.ping", "queue": "pings",
                                 "schema": PayloadModel(Ping).schema}
    assert by_type["t.free"] == {"type": "t.free", "queue": "default", "schema": None}


def test_worker_help_names_the_handlers_flag_and_variable(
        capsys: pytest.CaptureFixture[str]) -> None:
    from taskline_cli.main import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["worker", "--help"])
    shown = capsys.readouterr().out
    assert "--handlers MOD1,MOD2" in shown and "TASKLINE_HANDLERS" in shown
