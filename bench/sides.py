"""Statements of two checkouts timed side by side (queue_count.py, settle_plan.py): another
checkout's SQL source, the rounds in which the sides take turns, and the medians of the timings
with their ratio."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Iterator
from pathlib import Path

WARMUP = 2
"""Rounds run first and not counted: they prepare the statements and warm the caches."""


def sql_source(checkout: Path | None) -> str | None:
    """The SQL files of `checkout` as one source for `load_queries` (None: this checkout's)."""
    if checkout is None:
        return None
    folder = checkout / "shared" / "taskline" / "store" / "sql"
    return "\n".join(f.read_text() for f in sorted(folder.glob("*.sql")))


def in_turn(sides: Iterable[str], rounds: int) -> Iterator[tuple[bool, list[str]]]:
    """For each of WARMUP + `rounds` rounds, whether it counts and the order the sides run in:
    which goes first alternates, so neither side always runs on what the other left behind."""
    names = list(sides)
    for n in range(rounds + WARMUP):
        yield n >= WARMUP, names if n % 2 else names[::-1]


def medians(took: dict[str, list[float]]) -> dict[str, float]:
    """Each side's median microseconds, and before / after (above 1: cheaper now) as the median
    of the rounds' ratios when a `before` side ran."""
    out = {f"{name}_us": round(statistics.median(v), 1) for name, v in took.items()}
    if "before" in took:
        out["before_over_after"] = round(statistics.median(
            b / a for b, a in zip(took["before"], took["after"], strict=True)), 3)
    return out
