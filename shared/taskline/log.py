"""Logging set-up: JSON lines in production, readable text for `make run`.

Job-path records carry their context as `extra` fields (job_id, queue, attempt, worker, type,
action, duration_s, error); the JSON formatter emits every such field, the text one appends them.
In JSON every record names its service, and a record with an `action` also carries it as
`event`, the field log pipelines key on: one schema for all three services (docs/observability.md).

Invariant: a record is one line, whatever a client put into the strings it carries (a job type,
a queue name, an error message): in both formats every control character (C0 and C1, so
newline, carriage return and the ESC of ANSI sequences; DEL), every Unicode line or paragraph
separator and every bidirectional override is written as `\\uXXXX`, so no client string can
start a forged record or drive the terminal that shows the log. In JSON the escape is JSON's
own, so a parser reads the original string back; a text record's traceback keeps its lines,
each indented, so only a record's first line starts with its time.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import Any

import orjson

SERVICE = {"name": "taskline"}
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message",
                                                                              "asctime"}
# What a terminal or a log reader acts on: C0 and C1 controls, DEL, the Unicode line and
# paragraph separators, and the bidirectional marks and overrides that reorder a line's text.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")
# JSON's short escapes (\n, \t ...), written as \uXXXX like every other control character;
# an escaped backslash is matched as a whole so the `n` of `\\n` is never taken for one.
_JSON_ESCAPE = re.compile(r"\\(.)")
_JSON_SHORT = {"b": "\\u0008", "t": "\\u0009", "n": "\\u000a", "f": "\\u000c", "r": "\\u000d"}
TRACEBACK_INDENT = "    "


def escape(text: str) -> str:
    """`text` with every character `_UNSAFE` matches written as `\\uXXXX`."""
    return _UNSAFE.sub(_code_point, text)


def _code_point(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def escape_json(line: str) -> str:
    """A JSON text with the same meaning, in which every control character is `\\uXXXX`.

    Outside strings JSON text is printable ASCII, so only string contents change, and each
    escape decodes to the character it replaces.
    """
    if "\\" not in line and line.isascii() and "\x7f" not in line:
        # Most lines: no escape to rewrite, and the JSON writers leave no raw C0 character.
        return line
    return escape(_JSON_ESCAPE.sub(lambda m: _JSON_SHORT.get(m.group(1), m.group()), line))


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
            line = orjson.dumps(entry, default=str).decode()
        except TypeError:  # orjson.JSONEncodeError: an integer past 64 bits, a non-str key
            line = json.dumps(entry, default=str)
        return escape_json(line)

    def _timestamp(self, second: int) -> str:
        cached, text = self._second  # one tuple: threads never see one second's text for another
        if second != cached:
            text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = (second, text)
        return text


class TextFormatter(logging.Formatter):
    """`time level logger: message key=value ...` for humans, escaped (see the module doc)."""

    def format(self, record: logging.LogRecord) -> str:
        extra = " ".join(f"{k}={v}" for k, v in vars(record).items() if k not in _STANDARD)
        line = (f"{time.strftime('%H:%M:%S', time.localtime(record.created))} "
                f"{record.levelname:<7} {record.name}: {record.getMessage()}")
        line = escape(f"{line} {extra}" if extra else line)
        if record.exc_info:
            # A traceback's lines stay lines; an exception message's newline starts one too,
            # so every line is indented: none can pass for a record's first line.
            trace = self.formatException(record.exc_info).split("\n")
            line += "".join(f"\n{TRACEBACK_INDENT}{escape(part)}" for part in trace)
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
