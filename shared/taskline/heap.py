"""Garbage-collector settings for taskline's long-running, allocation-heavy processes.

A worker or API process allocates many short-lived containers per job (rows, dicts, tuples),
so CPython's collector runs every few jobs, and its older generations hold every module, class
and function loaded at start-up: in a 2-process drain the collector was ~6 % of the machine's
CPU (perf; docs/performance.md). Once a process has started, those long-lived objects are moved
out of the collector's sight. The thresholds stay CPython's: spacing young collections out
(20,000 instead of 700) gained nothing measurable on top and let the heap creep (+2 MiB over
500,000 jobs instead of +0.8).
"""

from __future__ import annotations

import gc


def settle_after_start() -> None:
    """Freeze what start-up allocated (call once the process has started)."""
    gc.collect()
    gc.freeze()
