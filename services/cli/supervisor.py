"""Foreground supervision of a few child processes, for `taskline dev`.

Every line a child prints is shown with its padded, coloured name in front (`api    | ...`).
A child runs in a process group of its own, so Ctrl-C reaches only the supervisor, which then
stops the children in order: SIGTERM to each, a grace period for running jobs, SIGKILL to the
group of any straggler. The supervisor signals only children it started, by PID or by the
process group whose leader it has not yet reaped (so the id cannot have been reused). On Linux
each child also asks the kernel for SIGTERM when the supervisor dies, so even a SIGKILLed
supervisor leaves no service holding its ports.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

_COLOURS = ("36", "33", "35", "32", "34", "31")  # cyan, yellow, magenta, green, blue, red
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGTERM it when the supervisor dies, even by SIGKILL,
    so no orphaned service keeps the API or metrics port of the next run."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)  # type: ignore[union-attr]


class Console:
    """Writes whole lines with a name prefix; safe to call from several threads."""

    def __init__(self, stream: IO[str], names: Sequence[str], colour: bool | None = None):
        self.stream = stream
        self.width = max(len(name) for name in names)
        if colour is None:
            colour = stream.isatty() and "NO_COLOR" not in os.environ
        self._colours = {name: _COLOURS[i % len(_COLOURS)] for i, name in enumerate(names)}
        self._colour = colour
        self._lock = threading.Lock()

    def line(self, name: str, text: str) -> None:
        prefix = f"{name:<{self.width}} |"
        if self._colour:
            prefix = f"\033[{self._colours.get(name, '0')}m{prefix}\033[0m"
        with self._lock:
            self.stream.write(f"{prefix} {text}\n")
            self.stream.flush()


@dataclass(frozen=True)
class ServiceSpec:
    """One child: the name shown in front of its lines, its command and its environment."""

    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))


@dataclass
class _Child:
    spec: ServiceSpec
    proc: subprocess.Popen[bytes]
    pump: threading.Thread


@contextlib.contextmanager
def signals_handled(signals: Iterable[int], handler: Any) -> Iterator[None]:
    """Route `signals` to `handler` inside the block; the previous handlers come back after."""
    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class Supervisor:
    """Runs `specs` until a stop signal (exit 0) or until one of them exits (exit 1)."""

    def __init__(self, specs: Sequence[ServiceSpec], console: Console, stop_timeout_s: float,
                 label: str = "dev"):
        self.specs = list(specs)
        self.console = console
        self.stop_timeout_s = stop_timeout_s
        self.label = label
        self.children: list[_Child] = []
        self._wake = threading.Event()
        self._signals: list[int] = []

    def run(self) -> int:
        with self._trap_signals():
            try:
                # Fork every child before any pump thread exists: forking with threads
                # running is what makes a pre-exec hook unsafe.
                for spec in self.specs:
                    self._start(spec)
                for child in self.children:
                    child.pump.start()
                failed = self._wait()
            finally:
                self._stop_all()
        if failed is None:
            self.console.line(self.label, "stopped")
            return 0
        self.console.line(self.label, f"{failed.spec.name} exited unexpectedly with code "
                                      f"{failed.proc.returncode}; stopped the others")
        return 1

    def _trap_signals(self) -> contextlib.AbstractContextManager[None]:
        return signals_handled(STOP_SIGNALS, self._on_signal)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self._signals.append(signum)
        self._wake.set()

    def _start(self, spec: ServiceSpec) -> None:
        proc = subprocess.Popen(spec.argv, env=spec.env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True,
                                preexec_fn=_die_with_parent if _LIBC else None)
        pump = threading.Thread(target=self._pump, args=(spec.name, proc), daemon=True,
                                name=f"pump-{spec.name}")
        self.children.append(_Child(spec, proc, pump))

    def _pump(self, name: str, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            self.console.line(name, raw.decode(errors="replace").rstrip("\r\n"))
        self._wake.set()  # end of output usually means the child exited

    def _wait(self) -> _Child | None:
        """Block until a stop signal (None) or until a child exits (that child)."""
        while True:
            self._wake.wait(timeout=1.0)
            self._wake.clear()
            if self._signals:
                return None
            for child in self.children:
                if child.proc.poll() is not None:
                    return child

    def _stop_all(self) -> None:
        live = [c for c in self.children if c.proc.poll() is None]
        if live:
            names = ", ".join(c.spec.name for c in live)
            self.console.line(self.label, f"stopping {names}")
        for child in live:
            with contextlib.suppress(ProcessLookupError):
                child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout_s
        hurry_from = len(self._signals)
        for child in live:
            self._await_or_kill(child, deadline, hurry_from)
        for child in self.children:
            if child.pump.is_alive():
                child.pump.join(timeout=5)

    def _await_or_kill(self, child: _Child, deadline: float, hurry_from: int) -> None:
        """Wait for `child` until the deadline or a second Ctrl-C, then kill its group."""
        while child.proc.poll() is None:
            if time.monotonic() >= deadline or len(self._signals) > hurry_from:
                self.console.line(self.label, f"{child.spec.name} did not stop in time; "
                                              "killing it")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.proc.pid, signal.SIGKILL)
                child.proc.wait()
                return
            time.sleep(0.05)
