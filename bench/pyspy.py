"""py-spy for the benchmarks (bench/profile.py, bench/waiting.py): where it is, and a recording
of a process and its children for as long as a block runs.

py-spy comes from PyPI (`pip install py-spy`) and needs ptrace rights on the profiled process.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

PY_SPY = str(Path(sys.executable).with_name("py-spy"))


@contextlib.contextmanager
def recording(pid: int, out: Path, rate: int = 100, gil: bool = False) -> Iterator[None]:
    """py-spy records `pid` and its child processes (raw collapsed stacks into `out`) for as
    long as the block runs; `gil`: only the threads holding the GIL (what runs Python)."""
    proc = subprocess.Popen([PY_SPY, "record", "-p", str(pid), "--subprocesses", "-f", "raw",
                             "-o", str(out), "--nonblocking", "-r", str(rate),
                             *(["--gil"] if gil else [])],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # attached to every process before the measured work starts
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)  # py-spy writes its file when interrupted
        proc.wait(timeout=60)
