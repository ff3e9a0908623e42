"""Python bytecode instructions a call executes: a cost the machine's load does not move.

C code (the driver's, orjson's) counts only as the instruction that called it, so the count
measures the Python around the work, which is what a change to it moves.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


def count_opcodes(run: Callable[[], Any]) -> int:
    """The bytecode instructions `run()` executes, every frame it enters included."""
    count = 0

    def trace(frame: Any, event: str, _arg: Any) -> Any:
        nonlocal count
        if event == "call":
            frame.f_trace_opcodes = True
        elif event == "opcode":
            count += 1
        return trace

    sys.settrace(trace)
    try:
        run()
    finally:
        sys.settrace(None)
    return count
