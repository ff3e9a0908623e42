"""Garbage-collector settings for taskline's long-running, allocation-heavy processes.

A worker or API process allocates many short-lived containers per job (rows, dicts, tuples).
With CPython's default thresholds (700, 10, 10) that starts a collection every few jobs, and
the older generations it walks hold every module, class and function loaded at start-up. In a
2-process drain the collector was ~6 % of the machine's CPU (perf; docs/performance.md). Once
a process has started, its long-lived objects are moved out of the collector's sight and young
collections run less often. Reference cycles are still collected; the price is a few MB more
between collections.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 20_000


def settle_after_start() -> None:
    """Freeze what start-up allocated and space young collections out (call once started)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
