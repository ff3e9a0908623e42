"""Webhook payload validation and the mapping of HTTP answers to job outcomes (pure).

A bad payload can never succeed, so it must dead-letter the job (NonRetryableError) with a
message that says what to fix; 429 and 5xx are retried, honouring Retry-After within a cap.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from taskline.errors import NonRetryableError, RetryableError
from taskline.handlers.webhook import (
    MAX_TIMEOUT_S,
    RETRY_AFTER_MAX_S,
    WebhookRequest,
    outcome,
    retry_after_s,
)


def test_minimal_payload_gets_defaults() -> None:
    request = WebhookRequest.from_payload({"url": "https://hooks.example.com/x"})
    assert request.url == "https://hooks.example.com/x"
    assert request.has_body is False
    assert request.headers == {}
    assert request.timeout_s == 10.0


def test_full_payload_is_kept() -> None:
    request = WebhookRequest.from_payload({
        "url": "http://hooks.example.com:8080/in?x=1", "body": [1, {"a": None}],
        "headers": {"X-Sig": "abc"}, "timeout_s": 2.5, "method": "post",
    })
    assert request.body == [1, {"a": None}] and request.has_body
    assert request.headers == {"X-Sig": "abc"}
    assert request.timeout_s == 2.5


@pytest.mark.parametrize(("payload", "message"), [
    (None, "must be an object"),
    (["https://x.example"], "must be an object"),
    ({}, "`url` must be a string"),
    ({"url": 5}, "`url` must be a string"),
    ({"url": "https://x.example/" + "a" * 3000}, "`url` must be a string"),
    ({"url": "ftp://x.example/"}, "http:// or https://"),
    ({"url": "file:///etc/passwd"}, "http:// or https://"),
    ({"url": "/relative"}, "http:// or https://"),
    ({"url": "https://user:pw@x.example/"}, "credentials"),
    ({"url": "https://x.example:99999/"}, "malformed"),
    ({"url": "https://x.example/a b"}, "whitespace"),
    ({"url": "https://x.example", "method": "GET"}, "must be POST"),
    ({"url": "https://x.example", "timeout_s": 0}, "timeout_s"),
    ({"url": "https://x.example", "timeout_s": MAX_TIMEOUT_S + 1}, "timeout_s"),
    ({"url": "https://x.example", "timeout_s": True}, "must be a number"),
    ({"url": "https://x.example", "timeout_s": "5"}, "must be a number"),
    ({"url": "https://x.example", "headers": ["a"]}, "`headers` must be an object"),
    ({"url": "https://x.example", "headers": {"X": 1}}, "string value"),
    ({"url": "https://x.example", "headers": {"Bad Name": "v"}}, "token"),
    ({"url": "https://x.example", "headers": {"X": "a\r\nInjected: 1"}}, "CR, LF or NUL"),
    ({"url": "https://x.example", "headers": {"Host": "internal"}}, "set by taskline"),
    ({"url": "https://x.example", "headers": {"idempotency-key": "k"}}, "set by taskline"),
    ({"url": "https://x.example", "extra": 1}, "unknown fields: extra"),
])
def test_bad_payloads_are_not_retried(payload: object, message: str) -> None:
    with pytest.raises(NonRetryableError, match=message):
        WebhookRequest.from_payload(payload)


@pytest.mark.parametrize("status", [200, 201, 202, 204, 299])
def test_2xx_is_the_result(status: int) -> None:
    assert outcome(status, {}, "ok") == {"status": status, "body": "ok"}


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504, 599])
def test_429_and_5xx_are_retried_with_retry_after(status: int) -> None:
    with pytest.raises(RetryableError) as info:
        outcome(status, {"Retry-After": "7"}, "busy")
    assert info.value.delay_s == 7.0
    assert str(status) in str(info.value)


def test_retry_without_retry_after_uses_the_backoff() -> None:
    with pytest.raises(RetryableError) as info:
        outcome(503, {}, "")
    assert info.value.delay_s is None


@pytest.mark.parametrize("status", [400, 401, 403, 404, 410, 422])
def test_other_4xx_dead_letters(status: int) -> None:
    with pytest.raises(NonRetryableError, match=f"answered {status}"):
        outcome(status, {}, "nope")


def test_redirect_is_reported_not_followed() -> None:
    with pytest.raises(NonRetryableError, match="redirects are not followed"):
        outcome(302, {"Location": "http://169.254.169.254/"}, "")


def test_retry_after_forms() -> None:
    now = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert retry_after_s(None) is None
    assert retry_after_s("") is None
    assert retry_after_s(" 30 ") == 30.0
    assert retry_after_s("99999999") == RETRY_AFTER_MAX_S
    assert retry_after_s("Wed, 01 Jan 2025 12:01:00 GMT", now) == 60.0
    assert retry_after_s("Wed, 01 Jan 2025 11:00:00 GMT", now) == 0.0
    assert retry_after_s("soon") is None
    assert retry_after_s("-5") is None
