"""The Python client's own CPU per call, against the real API on the benchmark's stack.

Usage: python bench/client_cpu.py [--calls N] [--client-file PATH]

Starts the benchmark's stack (bench/stack.py: a private PostgreSQL, the API under gunicorn),
then makes `--calls` single enqueues with `Client.enqueue` in this process after a warm-up, and
prints this process's CPU time (user and system) per call, with the wall time per call beside
it. `--client-file` loads `Client` from another copy of shared/taskline/client.py (for example
an earlier release's, `git show REV:shared/taskline/client.py > /tmp/client_before.py`), so a
before and after pair is measured the same way in one run.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from stack import open_stack


def load_client(path: str | None) -> Any:
    if path is None:
        from taskline.client import Client
        return Client
    spec = importlib.util.spec_from_file_location("client_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Client


def measure(base: str, client_class: Any, calls: int) -> dict[str, float]:
    with client_class(base, attempts=1) as client:
        for _ in range(50):
            client.enqueue("bench.noop")
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(calls):
            client.enqueue("bench.noop")
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {"cpu_ms_per_call": 1000 * cpu / calls, "wall_ms_per_call": 1000 * wall / calls}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--client-file", default=None)
    args = parser.parse_args()
    client_class = load_client(args.client_file)
    with open_stack(False) as stack:
        stack.reset()
        with stack.api() as base:
            result = measure(base, client_class, args.calls)
    print(f"client {args.client_file or 'taskline.client'}: "
          f"{result['cpu_ms_per_call']:.3f} ms CPU, {result['wall_ms_per_call']:.3f} ms wall "
          f"per enqueue ({args.calls} calls)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
