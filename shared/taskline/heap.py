"""Garbage-collector settings for taskline's long-running, allocation-heavy processes.

A worker or API process allocates many short-lived containers per job (rows, dicts, tuples),
so CPython's collector runs every few jobs, and its older generations hold every module, class
and function loaded at start-up, which a busy drain spends a measurable share of the machine's
CPU re-scanning (docs/performance.md). Once a process has started, those long-lived objects are
moved out of the collector's sight. The thresholds stay CPython's: spacing young collections
out gained nothing measurable on top and let the heap creep.
"""

from __future__ import annotations

import gc


def settle_after_start() -> None:
    """Freeze what start-up allocated (call once the process has started)."""
    gc.collect()
    gc.freeze()
