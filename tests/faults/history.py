"""The history of one fault scenario: every client request and every nemesis action, as JSON lines.

Invariant: a record is appended (and flushed) the moment its event ends, under one lock, so the
file is complete up to the last finished event even if the test process dies; the checker reads
it back offline and trusts nothing else about what the client was told.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def stamp() -> dict[str, float]:
    """Both clocks at once: monotonic for durations, wall for comparing with PostgreSQL's."""
    return {"mono": time.monotonic(), "wall": time.time()}


class History:
    """Append-only JSON-lines file shared by the workload threads and the nemesis."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def record(self, kind: str, **fields: Any) -> dict[str, Any]:
        entry = {"kind": kind, **fields}
        line = json.dumps(entry, default=str)
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()
        return entry

    def close(self) -> None:
        with self._lock:
            self._file.close()

    def entries(self, kind: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            self._file.flush()
        return [e for e in read(self.path) if kind is None or e["kind"] == kind]


def read(path: Path) -> Iterator[dict[str, Any]]:
    """The records of a history file, in the order they were written."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)
