"""A running job's progress (`ctx.progress(value)`): what a value may be, and how often it is
written.

A value is a number in 0..1 or a JSON object of at most 4 KiB (its compact UTF-8 encoding); any
other is refused at the call (TypeError or ValueError), before anything is written. The worker
writes at most one value per job per second, fenced on the attempt's lease (a zombie's value is
refused); a value reported sooner is held and written by the next call at least a second after
the last write, or when the handler ends, before its outcome: the last value reported is always
the one the job shows once its attempt ended.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from typing import Any

MAX_BYTES = 4096
INTERVAL_S = 1.0
_UNSET = object()


def validate(value: Any) -> Any:
    """`value` as stored: a float in 0..1, or a JSON object of at most MAX_BYTES."""
    if isinstance(value, bool):
        raise TypeError("progress is a number in 0..1 or a JSON object, not a boolean")
    if isinstance(value, int | float):
        if not (math.isfinite(value) and 0 <= value <= 1):
            raise ValueError(f"progress must be a number in 0..1, not {value!r}")
        return float(value)
    if not isinstance(value, dict):
        raise TypeError("progress is a number in 0..1 or a JSON object, "
                        f"not {type(value).__name__}")
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise ValueError(f"progress object is not JSON: {err}") from None
    if len(text.encode("utf-8")) > MAX_BYTES or "\\u0000" in text:
        raise ValueError(f"progress object must encode to at most {MAX_BYTES} bytes, no NUL")
    return json.loads(text)


class Reporter:
    """Writes one attempt's progress at most once per INTERVAL_S; `flush` writes what is held."""

    def __init__(self, write: Callable[[Any], bool],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._write = write
        self._clock = clock
        self._lock = threading.Lock()
        self._written_at = float("-inf")
        self._held: Any = _UNSET

    def report(self, value: Any) -> None:
        with self._lock:
            if self._clock() - self._written_at < INTERVAL_S:
                self._held = value
                return
            self._send(value)

    def flush(self) -> None:
        with self._lock:
            if self._held is not _UNSET:
                self._send(self._held)

    def _send(self, value: Any) -> None:
        self._held = _UNSET
        self._written_at = self._clock()
        self._write(value)
