"""The built-in `report` handler: exact summaries of given data, the same report for the same
seed, bounded sizes, malformed payloads failing without retries, and a stop request honoured."""

from __future__ import annotations

import uuid

import pytest

from taskline.errors import JobCancelled, NonRetryableError
from taskline.handlers.builtin import REPORT_MAX_SIZE, report
from taskline.handlers.registry import JobContext


def _ctx() -> JobContext:
    return JobContext(job_id=uuid.uuid4(), attempt=1, queue="default", type="report",
                      worker_id="w-test")


def test_given_data_is_summarised_per_group_exactly():
    data = [{"group": "eu", "value": v} for v in (1, 2, 3, 4)] + [{"group": "us", "value": 11}]
    result = report({"data": data, "top": 1}, _ctx())
    assert result["rows"] == 5 and result["top"] == ["us"]
    assert result["groups"]["eu"] == {"count": 4, "sum": 10.0, "mean": 2.5, "stdev": 1.118,
                                      "min": 1.0, "max": 4.0, "p50": 2.0, "p90": 4.0, "p99": 4.0}
    assert result["groups"]["us"]["count"] == 1 and result["groups"]["us"]["p50"] == 11.0


def test_plain_numbers_form_one_group():
    result = report({"data": [5, 1.5, 3]}, _ctx())
    assert list(result["groups"]) == ["all"]
    assert result["groups"]["all"]["max"] == 5.0 and result["groups"]["all"]["p50"] == 3.0


def test_generated_data_gives_the_same_summary_for_the_same_seed():
    first = report({"size": 5000, "groups": 4, "seed": 7}, _ctx())
    again = report({"size": 5000, "groups": 4, "seed": 7}, _ctx())
    other = report({"size": 5000, "groups": 4, "seed": 8}, _ctx())
    assert first["rows"] == 5000 and len(first["groups"]) == 4 and len(first["top"]) == 4
    assert first["groups"] == again["groups"] and first["groups"] != other["groups"]
    assert sum(g["count"] for g in first["groups"].values()) == 5000


def test_defaults_make_ten_thousand_rows_in_ten_groups():
    result = report(None, _ctx())
    assert result["rows"] == 10_000 and len(result["groups"]) == 10 and len(result["top"]) == 5


def test_an_empty_data_set_gives_an_empty_report():
    assert report({"size": 0}, _ctx())["groups"] == {}


@pytest.mark.parametrize("payload", [
    {"size": REPORT_MAX_SIZE + 1}, {"size": -1}, {"size": "10"}, {"groups": 0},
    {"top": True}, {"seed": [1]}, {"data": "1,2,3"}, {"data": [1, "two"]},
    {"data": [{"group": "a"}]}, {"data": [float("nan")]},
])
def test_a_malformed_payload_fails_without_retries(payload):
    with pytest.raises(NonRetryableError):
        report(payload, _ctx())


def test_a_stop_request_ends_the_report_unfinished():
    ctx = _ctx()
    ctx.request_stop()
    with pytest.raises(JobCancelled):
        report({"size": REPORT_MAX_SIZE}, ctx)
