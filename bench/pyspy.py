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


def start_recording(pid: int, out: Path, rate: int = 100, gil: bool = False) -> subprocess.Popen:
    """py-spy recording `pid` and its child processes (raw collapsed stacks into `out`) until
    it is sent SIGINT; `gil`: only the threads holding the GIL (what runs Python)."""
    return subprocess.Popen([PY_SPY, "record", "-p", str(pid), "--subprocesses", "-f", "raw",
                             "-o", str(out), "--nonblocking", "-r", str(rate),
                             *(["--gil"] if gil else [])],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop_recording(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)  # py-spy writes its file when interrupted
    proc.wait(timeout=60)


@contextlib.contextmanager
def recording(pid: int, out: Path, rate: int = 100, gil: bool = False) -> Iterator[None]:
    """`start_recording` for as long as the block runs."""
    proc = start_recording(pid, out, rate, gil)
    time.sleep(1.0)  # attached to every process before the measured work starts
    try:
        yield
    finally:
        stop_recording(proc)
