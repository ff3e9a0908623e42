"""The JSON log line: its fields, its timestamp, values orjson cannot write, and the switches
`log.setup` turns off because no formatter prints them."""

from __future__ import annotations

import io
import json
import logging
import sys
from datetime import UTC, datetime

import pytest

from taskline import log


def record(msg: str = "job succeeded", created: float | None = None, **extra: object,
           ) -> logging.LogRecord:
    rec = logging.LogRecord("taskline_worker.outcomes", logging.INFO, __file__, 1, msg, (), None)
    if created is not None:
        rec.created, rec.msecs = created, (created % 1) * 1000
    rec.__dict__.update(extra)
    return rec


def test_a_job_record_is_one_json_object_with_its_fields_and_event():
    line = log.JsonFormatter().format(record(action="succeeded", job_id="j-1", attempt=2,
                                             duration_s=0.25))
    entry = json.loads(line)
    assert "\n" not in line
    assert entry["level"] == "info" and entry["logger"] == "taskline_worker.outcomes"
    assert entry["msg"] == "job succeeded" and entry["event"] == entry["action"] == "succeeded"
    assert (entry["job_id"], entry["attempt"], entry["duration_s"]) == ("j-1", 2, 0.25)
    assert not {"args", "lineno", "thread", "process", "pathname"} & entry.keys()


def test_timestamps_follow_the_record_across_seconds_in_utc():
    formatter = log.JsonFormatter()
    # Binary fractions: the milliseconds are exact, as the record's own are truncated.
    instants = [1_700_000_000.125, 1_700_000_000.75, 1_700_000_001.5, 1_699_999_999.0]
    for created in instants:
        expected = datetime.fromtimestamp(created, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3]
        assert json.loads(formatter.format(record(created=created)))["ts"] == expected + "Z"


def test_values_orjson_refuses_are_still_written_exactly():
    big = 10**30
    entry = json.loads(log.JsonFormatter().format(record(count=big, when=object())))
    assert entry["count"] == big
    assert entry["when"].startswith("<object object")


def test_an_exception_is_written_with_its_traceback():
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        rec = record("handler failed")
        rec.exc_info = sys.exc_info()
    entry = json.loads(log.JsonFormatter().format(rec))
    assert "RuntimeError: boom" in entry["exc"]


@pytest.fixture
def restored_logging():
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, logging._srcfile, logging.logThreads,
             logging.logProcesses, logging.logMultiprocessing)
    yield
    root.handlers[:], level = saved[0], saved[1]
    root.setLevel(level)
    (logging._srcfile, logging.logThreads, logging.logProcesses,
     logging.logMultiprocessing) = saved[2:]


def test_setup_skips_the_caller_thread_and_process_that_no_line_prints(restored_logging):
    log.setup("worker", "json", "INFO")
    out = io.StringIO()
    logging.getLogger().handlers[0].setStream(out)
    captured: list[logging.LogRecord] = []
    logging.getLogger().handlers[0].addFilter(lambda r: captured.append(r) or True)
    logging.getLogger("taskline_worker.outcomes").info("job succeeded",
                                                       extra={"action": "succeeded"})
    (rec,) = captured
    assert (rec.lineno, rec.threadName, rec.processName) == (0, None, None)
    entry = json.loads(out.getvalue())
    assert entry["service"] == "worker" and entry["event"] == "succeeded"
