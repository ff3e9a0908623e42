"""The image's HEALTHCHECK: asks the running taskline service over HTTP whether it is alive.

One image runs every service, so the check first reads which one this container runs from the
command line of PID 1 (the service itself, or docker-init naming it): the api answers
`/healthz` on its `--bind` port; worker and maintenance answer `/metrics` on `--metrics-port`
(default TASKLINE_METRICS_PORT, 9100). A one-shot command (migrate, client commands) has
nothing to probe and counts as healthy while it runs. Invariant: the check does no I/O beyond
one loopback HTTP request with a timeout, so a wedged service fails it instead of hanging it.

Usage: python healthcheck.py [taskline COMMAND ...]   (default: PID 1's command line)
"""

from __future__ import annotations

import os
import sys
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

TIMEOUT_S = 3.0
DEFAULT_API_PORT = 8000
DEFAULT_METRICS_PORT = 9100
# The console script, and the module the worker re-executes itself through when it recycles.
ENTRY_POINTS = ("taskline", "taskline_cli.main")


def service_command(argv: Sequence[str]) -> list[str]:
    """The taskline arguments of a command line: what follows its entry point, or []."""
    for i, arg in enumerate(argv):
        if Path(arg).name in ENTRY_POINTS or arg in ENTRY_POINTS:
            return list(argv[i + 1:])
    return []


def option(args: Sequence[str], name: str) -> str | None:
    """The value of `--name VALUE` or `--name=VALUE`, the last one given."""
    value = None
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


def probe_url(args: Sequence[str], env: Mapping[str, str]) -> str | None:
    """The URL that tells whether this service is alive, or None when there is none."""
    command = args[0] if args else ""
    if command == "api":
        host, _, port = (option(args, "--bind") or "").rpartition(":")
        host = host.strip("[]")
        if host in ("", "0.0.0.0", "::"):
            host = "127.0.0.1"
        return f"http://{host}:{port or DEFAULT_API_PORT}/healthz"
    if command in ("worker", "maintenance"):
        port = option(args, "--metrics-port") or env.get("TASKLINE_METRICS_PORT") or ""
        port = port or str(DEFAULT_METRICS_PORT)
        return None if int(port) == 0 else f"http://127.0.0.1:{port}/metrics"
    return None


def main_command_line() -> list[str]:
    """PID 1's command line: the service itself, or docker-init (compose `init: true`), whose
    own command line names the service it started."""
    return _cmdline(1)


def _cmdline(pid: int) -> list[str]:
    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def check(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            return response.status == 200
    except OSError as err:
        print(f"unhealthy: {url}: {err}", file=sys.stderr)
        return False


def main(argv: Sequence[str]) -> int:
    args = service_command(argv) if argv else service_command(main_command_line())
    url = probe_url(args, os.environ)
    if url is None:
        print(f"healthy: nothing to probe for {' '.join(args[:1]) or 'this command'}")
        return 0
    return 0 if check(url) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
