"""The JSON log line: its fields, its timestamp, values orjson cannot write, and the switches
`log.setup` turns off because no formatter prints them; client strings escaped in both formats
so none can forge a record or reach a terminal raw."""

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
    rec = logging.LogRecord("taskline.execution.outcomes", logging.INFO, __file__, 1, msg, (), None)
    if created is not None:
        rec.created, rec.msecs = created, (created % 1) * 1000
    rec.__dict__.update(extra)
    return rec


def test_a_job_record_is_one_json_object_with_its_fields_and_event():
    line = log.JsonFormatter().format(record(action="succeeded", job_id="j-1", attempt=2,
                                             duration_s=0.25))
    entry = json.loads(line)
    assert "\n" not in line
    assert entry["level"] == "info" and entry["logger"] == "taskline.execution.outcomes"
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


# A job type a client could send: a newline and a forged record, ANSI colour and screen-clear
# sequences, a C1 control (NEL), DEL, a Unicode line separator and a right-to-left override.
FORGED = ("echo\n12:00:00 INFO    taskline.execution.outcomes: job succeeded"
          "\x1b[31m\x1b[2J\r\x85\x7f\u2028\u202e")
RAW = ("\n", "\r", "\x1b", "\x85", "\x7f", "\u2028", "\u202e")


def test_client_strings_are_escaped_in_json_and_read_back_unchanged():
    rec = record(msg=f"unknown type {FORGED}", type=FORGED, detail={"queue": FORGED})
    line = log.JsonFormatter().format(rec)
    assert len(line.splitlines()) == 1 and not any(c in line for c in RAW)
    assert "\\u000a12:00:00" in line and "\\u001b[31m" in line and "\\u2028" in line
    entry = json.loads(line)
    assert entry["type"] == entry["detail"]["queue"] == FORGED
    assert entry["msg"] == f"unknown type {FORGED}"
    # An escaped backslash stays one: `\\n` is a backslash and an n, never a newline.
    assert json.loads(log.JsonFormatter().format(record(msg="a\\nb")))["msg"] == "a\\nb"


def test_client_strings_are_escaped_in_text():
    rec = record(msg=f"unknown type {FORGED}", type=FORGED)
    line = log.TextFormatter().format(rec)
    assert len(line.splitlines()) == 1 and not any(c in line for c in RAW)
    assert "unknown type echo\\u000a12:00:00 INFO" in line
    assert "type=echo\\u000a12:00:00" in line and "\\u001b[2J\\u000d\\u0085\\u007f" in line


def test_a_text_traceback_cannot_forge_a_record():
    try:
        raise RuntimeError(f"bad type {FORGED}")
    except RuntimeError:
        rec = record("handler failed")
        rec.exc_info = sys.exc_info()
    first, *trace = log.TextFormatter().format(rec).split("\n")
    assert first.endswith("taskline.execution.outcomes: handler failed")
    assert trace[0] == log.TRACEBACK_INDENT + "Traceback (most recent call last):"
    assert all(part.startswith(log.TRACEBACK_INDENT) for part in trace)
    assert trace[-1].startswith(log.TRACEBACK_INDENT + "12:00:00 INFO")
    assert not any(c in part for part in trace for c in RAW if c != "\n")


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
    logging.getLogger("taskline.execution.outcomes").info("job succeeded",
                                                       extra={"action": "succeeded"})
    (rec,) = captured
    assert (rec.lineno, rec.threadName, rec.processName) == (0, None, None)
    entry = json.loads(out.getvalue())
    assert entry["service"] == "worker" and entry["event"] == "succeeded"
