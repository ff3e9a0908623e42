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

SERVICE = {"name": "taskline"}
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
                  + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "service": SERVICE["name"],
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = {k: v for k, v in vars(record).items() if k not in _STANDARD}
        if "action" in fields:
            entry["event"] = fields["action"]
        entry.update(fields)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


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
    out = logging.StreamHandler(sys.stderr)
    out.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [out]
    root.setLevel(level.upper())
    for noisy in ("urllib3", "werkzeug"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
