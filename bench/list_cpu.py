"""The API's CPU per request for a repeated workflow list, beside a single enqueue and /healthz,
on one API of 2 processes (the benchmark's stack, a private PostgreSQL).

Five workflows of 1,000 steps are submitted; then, `--rounds` times in turn, one client sends
`--requests` requests of each kind one at a time on a kept-alive connection: the same GET
/api/v1/workflows (a lister polling: answered at the lane's pace, mostly from the list cache),
a single enqueue, and GET /healthz. For each it reports the median over the rounds of the API
processes' CPU (user + system, /proc, gunicorn's master and workers) and of PostgreSQL's, per
request, in ms. Run it with each checkout's interpreter to compare two (the API it starts is
that interpreter's taskline). Usage:
    python bench/list_cpu.py [--requests 1000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
from collections.abc import Callable
from urllib.parse import urlsplit

import cpu
from stack import open_stack
from workflows import LISTED, LISTED_STEPS, STAMP, _submit


def _requests(base: str, method: str, path: str, body: bytes | None, count: int) -> None:
    parts = urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname, parts.port)
    headers = {"Content-Type": "application/json"} if body else {}
    for _ in range(count):
        conn.request(method, path, body=body, headers=headers)
        answer = conn.getresponse()
        answer.read()
        if answer.status >= 300:
            raise RuntimeError(f"{method} {path}: {answer.status}")
    conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    kinds: dict[str, tuple[str, str, bytes | None]] = {
        "workflow list": ("GET", "/api/v1/workflows", None),
        "single enqueue": ("POST", "/api/v1/jobs", json.dumps(STAMP).encode()),
        "healthz": ("GET", "/healthz", None)}
    figures: dict[str, dict[str, list[float]]] = {k: {"api": [], "postgres": []} for k in kinds}
    with open_stack(False) as stack:
        stack.reset()
        with stack.api() as base:
            for i in range(LISTED):
                _submit(base, f"big{i}", [{"id": f"s{n}", "job": STAMP}
                                          for n in range(LISTED_STEPS)])
            probes: dict[str, Callable[[], float]] = {
                "api": cpu.tree_cpu([stack.api_pid]),
                "postgres": cpu.tree_cpu([stack.postmaster_pid() or 0])}
            for _ in range(args.rounds):
                for kind, (method, path, body) in kinds.items():
                    before = {name: probe() for name, probe in probes.items()}
                    _requests(base, method, path, body, args.requests)
                    for name, probe in probes.items():
                        figures[kind][name].append(
                            (probe() - before[name]) * 1000 / args.requests)
    for kind, by in figures.items():
        print(f"{kind:15} " + "  ".join(
            f"{name} {statistics.median(v):.3f} ms (min {min(v):.3f}, max {max(v):.3f})"
            for name, v in by.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
