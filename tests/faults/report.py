"""The fault suite's final table: one row per scenario, summed over the runs of the session.

Invariant: a row is added only from a checker result (`CheckResult.row()`), so every number in
the table was measured by the checker; the same table is printed at the end of the pytest
session and written to `test-artifacts/faults.json`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

COLUMNS = (("scenario", "scenario"), ("runs", "runs"), ("faults", "faults injected"),
           ("acknowledged", "jobs acknowledged"), ("ok", "ok"), ("lost", "lost"),
           ("duplicated", "duplicated"), ("stale_rejected", "stale completions rejected"),
           ("recover_s", "time to recover (s)"))
SUMMED = ("runs", "faults", "acknowledged", "ok", "ok_first_try", "recovered", "expired", "lost",
          "duplicated", "unexpected", "stale_rejected", "violations")


class FaultReport:
    """Collects checker rows; `table()` renders them, `write()` saves them as JSON."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}

    def add(self, row: dict[str, Any]) -> None:
        """Add one run's row; a scenario run again adds up, its recovery time is the worst."""
        name = row["scenario"]
        if name not in self.rows:
            self.rows[name] = dict(row)
            return
        mine = self.rows[name]
        for key in SUMMED:
            mine[key] = mine.get(key, 0) + row.get(key, 0)
        times = [t for t in (mine.get("recover_s"), row.get("recover_s")) if t is not None]
        mine["recover_s"] = max(times) if times else None

    def table(self) -> str:
        header = [title for _, title in COLUMNS]
        body = [[_cell(row.get(key)) for key, _ in COLUMNS] for row in self.rows.values()]
        widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
        lines = [_line(header, widths), "  ".join("-" * w for w in widths)]
        lines += [_line(r, widths) for r in body]
        return "\n".join(lines)

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"scenarios": list(self.rows.values())}, indent=2) + "\n")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def _line(cells: list[str], widths: list[int]) -> str:
    first = cells[0].ljust(widths[0])
    return "  ".join([first, *(c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))])
