"""Clock skew for one service: its wall clock runs `offset` ahead of (or behind) everyone else's.

libfaketime (Debian package `faketime`) fakes the wall clock through LD_PRELOAD. Two of its
habits break a Python 3.11 service, so this module adjusts them:
- by default it fakes CLOCK_MONOTONIC too, but Python's timed waits (sem_clockwait) reach the
  kernel unfaked, so every `Event.wait(timeout)` would sleep for decades; the monotonic clock
  is therefore left real (FAKETIME_DONT_FAKE_MONOTONIC=1), which is also what skew between
  machines looks like;
- with the monotonic clock real, its clock_nanosleep wrapper turns Python's absolute monotonic
  `time.sleep` deadline into EINVAL; a ten-line shim, preloaded first, sends non-wall-clock
  sleeps straight to the kernel. It is compiled once per test with the system C compiler.

Invariant: only the service given this environment is skewed; everything else, PostgreSQL
included, keeps the true time.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")

SHIM_SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>

/* Sleeps on any clock but the wall clock bypass libfaketime: that clock is not faked. */
int clock_nanosleep(clockid_t clock_id, int flags, const struct timespec *req,
                    struct timespec *rem)
{
    static int (*faked)(clockid_t, int, const struct timespec *, struct timespec *);
    if (clock_id != CLOCK_REALTIME)
        return syscall(SYS_clock_nanosleep, clock_id, flags, req, rem) == 0 ? 0 : errno;
    if (faked == NULL)
        faked = dlsym(RTLD_NEXT, "clock_nanosleep");
    return faked(clock_id, flags, req, rem);
}
"""


class SkewUnavailable(RuntimeError):
    """libfaketime or a C compiler is missing."""


def build_shim(workdir: Path) -> Path:
    """Compile the clock_nanosleep shim into `workdir`; returns the shared object's path."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise SkewUnavailable("no C compiler (cc/gcc) to build the clock shim")
    workdir.mkdir(parents=True, exist_ok=True)
    source, shared = workdir / "clockshim.c", workdir / "clockshim.so"
    if not shared.exists():
        source.write_text(SHIM_SOURCE)
        subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(shared), str(source),
                        "-ldl"], check=True, capture_output=True)
    return shared


def skewed_env(offset: str, workdir: Path) -> dict[str, str]:
    """Environment that runs a service with its wall clock shifted by `offset` (e.g. "+30s")."""
    if not LIBFAKETIME.exists():
        raise SkewUnavailable(f"{LIBFAKETIME} is missing: apt-get install faketime")
    shim = build_shim(Path(workdir) / "clockshim")
    return {"LD_PRELOAD": f"{shim} {LIBFAKETIME}", "FAKETIME": offset,
            "FAKETIME_DONT_FAKE_MONOTONIC": "1", "FAKETIME_NO_CACHE": "1"}
