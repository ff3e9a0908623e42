"""What the worker stores about a failure: a bounded, storable error text, a traceback tail,
a bounded reason label; which results jsonb can hold; and which report of a batch succeeded."""

from __future__ import annotations

import math
import uuid

import pytest

from taskline import transitions
from taskline.errors import NonRetryableError, RetryableError
from taskline.execution.outcomes import (
    ERROR_MAX,
    SUCCESS,
    Report,
    error_detail,
    error_text,
    failure_reason,
    newest_recorded,
    printable,
)
from taskline.execution.runner import BadResult, NoHandler, check_result
from taskline.jobs import Outcome
from tests.unit.test_worker_attempts import make_attempt


def raised(err: BaseException) -> BaseException:
    try:
        raise err
    except BaseException as caught:
        return caught


def test_error_text_is_type_and_message_truncated_and_storable():
    assert error_text(RuntimeError("boom")) == "RuntimeError: boom"
    assert error_text(KeyError()) == "KeyError"
    long = error_text(ValueError("x" * 10_000))
    assert len(long) == ERROR_MAX and long.startswith("ValueError: xxx")
    assert error_text(RuntimeError("nul\x00 and \udc80")) == "RuntimeError: nul\\x00 and \\udc80"
    printable("\udc80").encode("utf-8")  # no lone surrogate left


def test_error_detail_carries_the_error_and_the_traceback_tail():
    err = raised(RuntimeError("deep failure"))
    detail = error_detail(err)
    assert detail["error"] == "RuntimeError: deep failure"
    assert "raise err" in detail["traceback"] and "deep failure" in detail["traceback"]
    retry = transitions.retry(detail["error"], 1.23456, reason="retry with backoff",
                              detail=detail)
    assert retry.detail["outcome"] == "failed" and retry.detail["delay_s"] == 1.235
    assert retry.detail["traceback"] == detail["traceback"]
    dead = transitions.dead(detail["error"], reason="non-retryable error", detail=detail)
    assert "delay_s" not in dead.detail and dead.detail["reason"] == "non-retryable error"


@pytest.mark.parametrize(("err", "outcome", "reason"), [
    (TimeoutError("t"), Outcome.TIMEOUT, "timeout"),
    (NoHandler("no handler registered for type x"), Outcome.FAILED, "no_handler"),
    (BadResult("nan"), Outcome.FAILED, "bad_result"),
    (NonRetryableError("no"), Outcome.FAILED, "non_retryable"),
    (RetryableError("later", delay_s=5), Outcome.FAILED, "error"),
    (RuntimeError("x"), Outcome.FAILED, "error"),
])
def test_failure_reasons_form_a_bounded_set(err, outcome, reason):
    assert failure_reason(err, outcome) == reason


@pytest.mark.parametrize("result", [None, {"a": [1, 2.5, "é", True]}, "text", 3])
def test_storable_results_pass(result):
    check_result(result)


@pytest.mark.parametrize("result", [math.nan, {"x": math.inf}, object(), "nul\x00",
                                    {"bad": "\ud800"}, {(1, 2): "tuple key"}])
def test_results_jsonb_cannot_hold_fail_permanently(result):
    with pytest.raises(BadResult):
        check_result(result)


def test_of_two_attempts_of_one_job_in_a_batch_only_the_newest_succeeded():
    job_id = uuid.uuid4()
    zombie = Report(make_attempt(lease_id=1, attempts=1, job_id=job_id), SUCCESS)
    current = Report(make_attempt(lease_id=2, attempts=2, job_id=job_id), SUCCESS)
    other = Report(make_attempt(lease_id=3), SUCCESS)
    recorded = newest_recorded([zombie, current, other], {str(job_id)})
    assert recorded == [current]
