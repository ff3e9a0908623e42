"""Unit tests of the producer's pure request handling: body rules, job specs, cursors, tokens.

No I/O: these pin every validation rule the API applies before it touches PostgreSQL.
"""

from __future__ import annotations

import hmac
import json
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest
from flask.json.provider import DefaultJSONProvider

from taskline.jobs import Job
from taskline.jobspec import (
    KEY_CODE,
    FieldError,
    JobSpec,
    parse_batch,
    parse_datetime,
    parse_job,
    request_hash,
)
from taskline.settings import Settings
from taskline_producer.app import create_app
from taskline_producer.http import auth
from taskline_producer.http.auth import bearer_token, token_matches
from taskline_producer.operations.enqueuer import (
    Accepted,
    due_ms,
    initial_status,
    lock_order,
    needs_transaction,
)
from taskline_producer.schemas import body, paging
from taskline_producer.schemas.errors import (
    DuplicateKey,
    InvalidJson,
    InvalidParameter,
    InvalidString,
    NestingTooDeep,
    NonFiniteNumber,
)

SETTINGS = Settings.from_env(env={}, default_max_retries=7, default_timeout_s=12.5)


def errors_of(result: object) -> dict[str, str]:
    assert isinstance(result, list), result
    return {e.field: e.message for e in result}


# --- body -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("raw", "error"), [
    (b"", InvalidJson),
    (b"   ", InvalidJson),
    (b"{", InvalidJson),
    (b"\xff\xfe{}", InvalidJson),
    (b'{"a": 1, "a": 2}', DuplicateKey),
    (b'{"a": {"b": 1, "b": 1}}', DuplicateKey),
    (b'{"a": NaN}', NonFiniteNumber),
    (b'{"a": -Infinity}', NonFiniteNumber),
    (b'{"a": 1e400}', NonFiniteNumber),
    (b'{"a": "x\\u0000"}', InvalidString),
    (b'{"a\\u0000": 1}', InvalidString),
    (b'{"a": [[{"b": ["\\udc00"]}]]}', InvalidString),
    (b'{"a": "\\ud83d"}', InvalidString),
    (b"[" * 10_000 + b"]" * 10_000, NestingTooDeep),
    (b'{"a": ' * 65 + b"1" + b"}" * 65, NestingTooDeep),
    (b'{"a": ' + b"9" * 5000 + b"}", InvalidJson),
])
def test_parse_rejects_each_bad_body_class(raw: bytes, error: type) -> None:
    with pytest.raises(error):
        body.parse(raw)


def test_parse_accepts_what_postgresql_can_store() -> None:
    raw = ('{"emoji": "\\ud83d\\ude00", "deep": ' + "[" * 63 + "]" * 63
           + ', "brackets": "[[[[{{{{", "n": 1.5e300}').encode()
    value = body.parse(raw)
    assert value["emoji"] == "\U0001f600"
    assert value["brackets"] == "[[[[{{{{"


def test_nesting_depth_ignores_brackets_inside_strings() -> None:
    assert body.nesting_depth('{"a": "[[[[\\"[[[", "b": [[1]]}') == 3
    assert body.nesting_depth("1") == 0


# --- job specs ------------------------------------------------------------------------------

def test_defaults_come_from_settings() -> None:
    spec = parse_job({"type": "echo"}, SETTINGS)
    assert isinstance(spec, JobSpec)
    assert (spec.payload, spec.queue, spec.priority) == ({}, "default", 5)
    assert (spec.max_retries, spec.timeout_s, spec.delay_s) == (7, 12.5, 0.0)
    assert spec.run_at is None and spec.idempotency_key is None


def test_every_field_is_parsed() -> None:
    spec = parse_job({"type": "t", "payload": [1], "queue": "q.1:a-b_c", "priority": "critical",
                      "max_retries": 0, "timeout_s": 0.5, "run_at": "2030-01-01T01:00:00+01:00",
                      "idempotency_key": "k"}, SETTINGS)
    assert isinstance(spec, JobSpec)
    assert spec.priority == 9 and spec.max_retries == 0 and spec.timeout_s == 0.5
    assert spec.run_at == datetime(2030, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(("field", "value"), [
    ("type", ""), ("type", "x" * 201), ("type", 5), ("type", "a\x00b"),
    ("payload", None),
    ("queue", ""), ("queue", "a b"), ("queue", "x" * 65), ("queue", 1),
    ("priority", 10), ("priority", -1), ("priority", True), ("priority", "urgent"),
    ("priority", "HIGH"), ("priority", 5.5), ("priority", None),
    ("max_retries", 101), ("max_retries", -1), ("max_retries", False), ("max_retries", "3"),
    ("max_retries", 1.5),
    ("timeout_s", 0), ("timeout_s", -1), ("timeout_s", 86_400.5), ("timeout_s", True),
    ("timeout_s", "10"), ("timeout_s", 10**400),
    ("delay_s", -0.1), ("delay_s", 365 * 86_400 + 1), ("delay_s", False), ("delay_s", None),
    ("run_at", "2030-01-01T00:00:00"), ("run_at", "2030-01-01"), ("run_at", "tomorrow"),
    ("run_at", 1_900_000_000), ("run_at", "2030-02-30T00:00:00Z"),
    ("idempotency_key", ""), ("idempotency_key", "k" * 256), ("idempotency_key", 7),
    ("idempotency_key", "café-1"), ("idempotency_key", "a b"), ("idempotency_key", "a\tb"),
])
def test_each_invalid_field_is_reported_by_name(field: str, value: object) -> None:
    errors = errors_of(parse_job({"type": "t", field: value}, SETTINGS))
    assert list(errors) == [field]


def test_booleans_are_not_integers_but_integral_floats_are() -> None:
    spec = parse_job({"type": "t", "priority": 3.0, "max_retries": 2.0}, SETTINGS)
    assert isinstance(spec, JobSpec) and (spec.priority, spec.max_retries) == (3, 2)
    assert set(errors_of(parse_job({"type": "t", "priority": False}, SETTINGS))) == {"priority"}


def test_unknown_and_missing_fields_are_listed() -> None:
    errors = errors_of(parse_job({"payload": {}, "colour": 1, "size": 2}, SETTINGS))
    assert errors == {"colour": "unknown field", "size": "unknown field", "type": "required"}


def test_body_must_be_an_object() -> None:
    assert errors_of(parse_job([{"type": "t"}], SETTINGS)) == {
        "$": "the request body must be a JSON object"}


def test_delay_and_run_at_exclude_each_other() -> None:
    errors = errors_of(parse_job({"type": "t", "delay_s": 1, "run_at": "2030-01-01T00:00:00Z"},
                                 SETTINGS))
    assert list(errors) == ["run_at"]


def test_idempotency_key_from_header_and_field_must_agree() -> None:
    spec = parse_job({"type": "t"}, SETTINGS, header_key="h")
    assert isinstance(spec, JobSpec) and spec.idempotency_key == "h"
    same = parse_job({"type": "t", "idempotency_key": "h"}, SETTINGS, header_key="h")
    assert isinstance(same, JobSpec)
    assert list(errors_of(parse_job({"type": "t", "idempotency_key": "f"}, SETTINGS,
                                    header_key="h"))) == ["idempotency_key"]
    assert list(errors_of(parse_job({"type": "t"}, SETTINGS, header_key=""))) == [
        "Idempotency-Key"]


@pytest.mark.parametrize(("header", "key"), [
    ("order-1", "order-1"), ('"order-1"', "order-1"), ('"a\\"b"', 'a"b'),
    ('"back\\\\slash"', "back\\slash"), ("~!#$%&'*+-.^_`|", "~!#$%&'*+-.^_`|"),
])
def test_an_idempotency_header_names_the_same_key_as_the_body(header: str, key: str) -> None:
    by_header = parse_job({"type": "t"}, SETTINGS, header_key=header)
    by_body = parse_job({"type": "t", "idempotency_key": key}, SETTINGS)
    both = parse_job({"type": "t", "idempotency_key": key}, SETTINGS, header_key=header)
    assert isinstance(by_header, JobSpec) and isinstance(by_body, JobSpec)
    assert isinstance(both, JobSpec)
    assert by_header.idempotency_key == by_body.idempotency_key == both.idempotency_key == key
    assert by_header.request_hash == by_body.request_hash


@pytest.mark.parametrize("header", [
    "cafÃ©-1",  # UTF-8 bytes of café, as WSGI hands them over (Latin-1)
    "caf\xe9-1", "a b", 'ab"c', "a\\b", '"unterminated', '"bad \\x escape"', '""', '"a b"',
    "", "k" * 256, '"' + "k" * 256 + '"',
])
def test_an_invalid_idempotency_header_is_a_key_error(header: str) -> None:
    errors = parse_job({"type": "t"}, SETTINGS, header_key=header)
    assert isinstance(errors, list)
    assert [(e.field, e.code) for e in errors] == [("Idempotency-Key", KEY_CODE)]


def test_request_hash_ignores_key_order_and_the_key_itself() -> None:
    a = request_hash({"type": "t", "payload": {"x": 1, "y": 2}, "idempotency_key": "a"})
    b = request_hash({"payload": {"y": 2, "x": 1}, "type": "t"})
    c = request_hash({"type": "t", "payload": {"x": 1, "y": 3}})
    assert a == b != c


def test_only_a_job_with_a_key_carries_a_request_hash() -> None:
    plain = parse_job({"type": "t"}, SETTINGS)
    by_field = parse_job({"type": "t", "idempotency_key": "k"}, SETTINGS)
    by_header = parse_job({"type": "t"}, SETTINGS, "k")
    assert isinstance(plain, JobSpec) and plain.request_hash is None
    assert isinstance(by_field, JobSpec) and isinstance(by_header, JobSpec)
    assert by_field.request_hash == by_header.request_hash == request_hash({"type": "t"})


def test_escaped_backslash_before_u0000_is_text_not_nul() -> None:
    assert body.parse(b'{"a": "\\\\u0000"}') == {"a": "\\u0000"}


def test_batch_errors_carry_the_index() -> None:
    errors = errors_of(parse_batch({"jobs": [{"type": "ok"}, {"type": ""}, 5]}, SETTINGS))
    assert set(errors) == {"jobs[1].type", "jobs[2]"}


@pytest.mark.parametrize("value", [{}, {"jobs": []}, {"jobs": {}}, [],
                                   {"jobs": [{"type": "t"}] * 1001}])
def test_batch_shape_is_checked(value: object) -> None:
    result = parse_batch(value, SETTINGS)
    assert isinstance(result, list) and all(isinstance(e, FieldError) for e in result)


def test_batch_rejects_unknown_top_level_fields() -> None:
    assert "extra" in errors_of(parse_batch({"jobs": [{"type": "t"}], "extra": 1}, SETTINGS))


@pytest.mark.parametrize(("text", "expected"), [
    ("2030-01-01T00:00:00Z", datetime(2030, 1, 1, tzinfo=UTC)),
    ("2030-01-01t00:00:00z", datetime(2030, 1, 1, tzinfo=UTC)),
    ("2030-01-01T05:30:00.25+05:30", datetime(2030, 1, 1, 0, 0, 0, 250000, tzinfo=UTC)),
    ("2016-12-31T23:59:60Z", datetime(2017, 1, 1, tzinfo=UTC)),
    ("0000-01-01T00:00:00Z", datetime(1, 1, 2, tzinfo=UTC)),
    ("9999-12-31T23:59:59-12:00", datetime(9999, 12, 30, tzinfo=UTC)),
    ("20300101T000000+00:00", None),  # ISO 8601 basic format: not RFC 3339
    ("2030-W01-1T00:00:00+00:00", None),  # an ISO week date
    ("\uff12\uff10\uff13\uff10-01-01T00:00:00Z", None),  # full-width digits
    ("2030-01-01T00:00:00.\uff15Z", None),
    ("2030-01-01T00:00:00", None),
    ("2030-01-01T00:00:00+24:00", None),
    ("2030-01-01T00:00:00+05:60", None),
    ("", None),
])
def test_parse_datetime(text: str, expected: datetime | None) -> None:
    assert parse_datetime(text) == expected


# --- status, due time -----------------------------------------------------------------------

def test_initial_status_uses_the_database_clock() -> None:
    now = datetime(2030, 1, 1, tzinfo=UTC)
    spec = parse_job({"type": "t", "run_at": "2030-01-01T00:00:01Z"}, SETTINGS)
    assert isinstance(spec, JobSpec)
    assert initial_status(spec, now) == "scheduled"
    assert initial_status(spec, now + timedelta(seconds=2)) == "queued"
    delayed = parse_job({"type": "t", "delay_s": 0.5}, SETTINGS)
    plain = parse_job({"type": "t", "delay_s": 0}, SETTINGS)
    assert initial_status(delayed, None) == "scheduled"  # type: ignore[arg-type]
    assert initial_status(plain, None) == "queued"  # type: ignore[arg-type]


def test_due_ms_rounds_like_postgresql() -> None:
    assert due_ms(datetime(1970, 1, 1, 0, 0, 1, 499, tzinfo=UTC)) == 1000
    assert due_ms(datetime(1970, 1, 1, 0, 0, 1, 500, tzinfo=UTC)) == 1001
    assert due_ms(datetime(1969, 12, 31, 23, 59, 59, 999500, tzinfo=UTC)) == -1


def test_due_ms_is_the_instants_in_any_zone_cached_or_not() -> None:
    # Cached by datetime: equal instants in two zones are equal keys, and share one answer.
    when = datetime(2026, 12, 4, 16, 0, 0, 123456, tzinfo=UTC)
    elsewhere = when.astimezone(timezone(timedelta(hours=-5)))
    assert due_ms(when) == due_ms(elsewhere) == 1796400000123
    assert due_ms(when + timedelta(microseconds=1000)) == 1796400000124


def test_accepted_created_job_is_what_its_init_builds() -> None:
    job = Job.of({"id": uuid.UUID(int=1), "type": "t", "queue": "q"})
    built = Accepted.created_job(job)
    assert built == Accepted(job, created=True)
    assert (built.created, built.duplicate, built.replaced, built.debounced) == (
        True, False, False, False)
    assert dict(built.flags()) == {}
    assert dict(Accepted(job, True, duplicate=True).flags()) == {"duplicate": True}


def _specs(*bodies: dict) -> list[JobSpec]:
    specs = [parse_job(b, SETTINGS) for b in bodies]
    assert all(isinstance(s, JobSpec) for s in specs)
    return specs  # type: ignore[return-value]


def test_only_a_batch_with_keys_needs_a_transaction() -> None:
    assert not needs_transaction(_specs({"type": "t"}))
    assert not needs_transaction(_specs({"type": "t", "idempotency_key": "k"}))
    assert not needs_transaction(_specs({"type": "t"}, {"type": "u"}))
    assert needs_transaction(_specs({"type": "t"}, {"type": "u", "idempotency_key": "k"}))


def test_keys_are_locked_in_one_global_order() -> None:
    assert lock_order(_specs({"type": "b"}, {"type": "a"}, {"type": "c"})) == [0, 1, 2]
    keyed = _specs({"type": "t", "idempotency_key": "z"}, {"type": "t", "queue": "a"},
                   {"type": "t", "idempotency_key": "b"}, {"type": "t"})
    assert lock_order(keyed) == [1, 3, 2, 0]


# --- response encoding ----------------------------------------------------------------------

@pytest.mark.parametrize("value", [
    {"a": 1, "é": "ü 😀", "b": [1.5, None, True, -0.0, 1e16]},
    {"big": 10**30}, {1: "int key"}, [uuid.UUID(int=1), datetime(2030, 1, 2, tzinfo=UTC)],
    {"spec": FieldError("f", "m")},
])
def test_response_encoder_writes_what_flask_writes(value: object) -> None:
    app = create_app(Settings.from_env(env={}))
    flask_default = DefaultJSONProvider(app)
    flask_default.sort_keys = False
    with app.app_context():
        fast, plain = app.json.response(value), flask_default.response(value)
    assert fast.mimetype == plain.mimetype == "application/json"
    assert json.loads(fast.get_data()) == json.loads(plain.get_data())
    assert list(json.loads(fast.get_data())) == list(json.loads(plain.get_data()))


# --- cursors and query parameters -----------------------------------------------------------

def test_cursor_round_trip() -> None:
    at, row_id = datetime(2030, 1, 1, 0, 0, 0, 123456, tzinfo=UTC), uuid.uuid4()
    assert paging.decode_cursor(paging.encode_cursor(at, row_id)) == (at, row_id)
    assert paging.decode_cursor(None) is None


@pytest.mark.parametrize("cursor", ["", "!!!", "e30", "WzFd", "x" * 300, "WyJhIiwiYiJd",
                                    "é", "WyIyMDMwLTAxLTAxVDAwOjAwOjAwIiwiYiJd"])
def test_bad_cursors_are_invalid_parameters(cursor: str) -> None:
    with pytest.raises(InvalidParameter):
        paging.decode_cursor(cursor)


@pytest.mark.parametrize("raw", ["0", "501", "-1", "+5", " 5", "5.0", "abc", ""])
def test_bad_limits(raw: str) -> None:
    with pytest.raises(InvalidParameter):
        paging.limit({"limit": raw})  # type: ignore[arg-type]


# --- tokens ---------------------------------------------------------------------------------

def test_bearer_token_parsing() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer  abc ") == "abc"
    assert bearer_token("Basic abc") is None
    assert bearer_token("Bearer") is None
    assert bearer_token(None) is None


def test_token_matches_any_configured_token() -> None:
    tokens = [b"first", b"second"]
    assert token_matches("second", tokens)
    assert not token_matches("secon", tokens)
    assert not token_matches("sécond", tokens)


def test_every_token_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """hmac.compare_digest sees every configured token, even after the first one matched."""
    compared: list[bytes] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append(b)
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    tokens = [b"one", b"two", b"three"]
    assert token_matches("one", tokens)
    assert compared == tokens
