"""Logging set-up: JSON lines in production, readable text for `make run`.

Job-path records carry their context as `extra` fields (job_id, queue, attempt, worker, type,
action, duration_s, error); the JSON formatter emits every such field, the text one appends them.
In JSON every record names its service, and a record with an `action` also carries it as
`event`, the field log pipelines key on: one schema for all three services (docs/observability.md).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

import orjson

SERVICE = {"name": "taskline"}
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message",
                                                                              "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line.

    Jobs log a line or two each at INFO (accepted, claimed, succeeded), so a record's cost is
    a per-job cost: orjson writes the line, and the second's text is kept while it lasts.
    """

    def __init__(self) -> None:
        super().__init__()
        self._second: tuple[int, str] = (-1, "")

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": f"{self._timestamp(int(record.created))}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "service": SERVICE["name"],
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = {k: v for k, v in record.__dict__.items() if k not in _STANDARD}
        if "action" in fields:
            entry["event"] = fields["action"]
        entry.update(fields)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        try:
            return orjson.dumps(entry, default=str).decode()
        except TypeError:  # orjson.JSONEncodeError: an integer past 64 bits, a non-str key
            return json.dumps(entry, default=str)

    def _timestamp(self, second: int) -> str:
        cached, text = self._second  # one tuple: threads never see one second's text for another
        if second != cached:
            text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = (second, text)
        return text


class TextFormatter(logging.Formatter):
    """`time level logger: message key=value ...` for humans."""

    def format(self, record: logging.LogRecord) -> str:
        extra = " ".join(f"{k}={v}" for k, v in vars(record).items() if k not in _STANDARD)
        line = (f"{time.strftime('%H:%M:%S', time.localtime(record.created))} "
                f"{record.levelname:<7} {record.name}: {record.getMessage()}")
        line = f"{line} {extra}" if extra else line
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup(service: str, fmt: str = "json", level: str = "INFO") -> None:
    """Configure the root logger of a service process once."""
    SERVICE["name"] = service
    # No formatter prints the caller, thread or process, and a job logs at INFO: skip
    # collecting them per record (the logging HOWTO's "Optimization" section).
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    out = logging.StreamHandler(sys.stderr)
    out.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [out]
    root.setLevel(level.upper())
    for noisy in ("urllib3", "werkzeug"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def job_fields(action: str, job: Any) -> dict[str, Any]:
    """The fields of a job-path log record (action, job id, queue, type, attempt), named the
    same by every service, so one query finds a job's records wherever they were written."""
    return {"action": action, "job_id": str(job.id), "queue": job.queue, "type": job.type,
            "attempt": job.attempts}
