"""Statements of two checkouts timed side by side (queue_count.py, settle_plan.py): another
checkout's SQL source, and the medians of the alternated timings with their ratio."""

from __future__ import annotations

import statistics
from pathlib import Path


def sql_source(checkout: Path | None) -> str | None:
    """The SQL files of `checkout` as one source for `load_queries` (None: this checkout's)."""
    if checkout is None:
        return None
    folder = checkout / "shared" / "taskline" / "store" / "sql"
    return "\n".join(f.read_text() for f in sorted(folder.glob("*.sql")))


def medians(took: dict[str, list[float]]) -> dict[str, float]:
    """Each side's median microseconds, and before / after (above 1: cheaper now) as the median
    of the rounds' ratios when a `before` side ran."""
    out = {f"{name}_us": round(statistics.median(v), 1) for name, v in took.items()}
    if "before" in took:
        out["before_over_after"] = round(statistics.median(
            b / a for b, a in zip(took["before"], took["after"], strict=True)), 3)
    return out
