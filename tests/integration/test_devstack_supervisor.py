"""The dev stack's supervisor with small stand-in services: prefixed output, a clean stop on
Ctrl-C, SIGKILL for a service that ignores SIGTERM, exit 1 when a service dies, and no orphan
left behind when the supervisor itself is killed."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from taskline_cli.localservers import group_alive
from taskline_cli.supervisor import Console, ServiceSpec, Supervisor
from tests.helpers import wait_for

pytestmark = pytest.mark.slow

# Each stand-in prints, then (some) sends Ctrl-C to the supervisor, which is its parent.
ON_TERM_SAY_BYE = ("import signal, sys, time\n"
                   "def bye(*_):\n    print('bye', flush=True); sys.exit(0)\n"
                   "signal.signal(signal.SIGTERM, bye)\n")
CTRL_C_PARENT = "import os, signal; os.kill(os.getppid(), signal.SIGINT)\n"
IDLE = "while True: time.sleep(1)\n"


def _spec(name: str, code: str) -> ServiceSpec:
    return ServiceSpec(name, [sys.executable, "-u", "-c", code])


def _run(*specs: ServiceSpec, stop_timeout_s: float = 10.0) -> tuple[int, str, Supervisor]:
    out = io.StringIO()
    supervisor = Supervisor(specs, Console(out, ["dev", "api", "worker"], colour=False),
                            stop_timeout_s)
    return supervisor.run(), out.getvalue(), supervisor


def test_ctrl_c_stops_every_service_and_exits_0(tmp_path):
    # The worker sends Ctrl-C only once the api has its SIGTERM handler (the file says so).
    flag = tmp_path / "api-ready"
    api = _spec("api", ON_TERM_SAY_BYE + f"print('hello', flush=True); open({str(flag)!r}, 'w')\n"
                + IDLE)
    worker = _spec("worker", ON_TERM_SAY_BYE + "import os\n"
                   + f"while not os.path.exists({str(flag)!r}): time.sleep(0.01)\n"
                   + CTRL_C_PARENT + IDLE)
    code, text, supervisor = _run(api, worker)
    assert code == 0, text
    assert "api    | hello\n" in text
    assert "api    | bye\n" in text and "worker | bye\n" in text
    assert "dev    | stopped\n" in text
    assert all(child.proc.returncode == 0 for child in supervisor.children)


def test_a_service_that_ignores_sigterm_is_killed_after_the_timeout():
    stubborn = ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                + CTRL_C_PARENT + IDLE)
    code, text, supervisor = _run(_spec("worker", stubborn), stop_timeout_s=0.5)
    assert code == 0, text
    assert "worker did not stop in time; killing it" in text
    assert supervisor.children[0].proc.returncode == -9


def test_a_service_that_dies_stops_the_others_and_exits_1():
    dying = _spec("api", "print('boom', flush=True); raise SystemExit(3)")
    worker = _spec("worker", ON_TERM_SAY_BYE + IDLE)
    code, text, supervisor = _run(dying, worker)
    assert code == 1
    assert "api    | boom\n" in text
    assert "api exited unexpectedly with code 3; stopped the others" in text
    assert supervisor.children[1].proc.returncode is not None  # stopped, not left running


def test_console_colours_the_prefix_when_asked():
    out = io.StringIO()
    Console(out, ["dev", "api"], colour=True).line("api", "x")
    assert out.getvalue() == "\033[33mapi |\033[0m x\n"


def test_services_die_with_a_supervisor_killed_by_sigkill(tmp_path):
    pid_file = tmp_path / "service.pid"
    service = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n" + IDLE
    script = ("import io, sys; from taskline_cli.supervisor import Console, ServiceSpec, "
              "Supervisor; Supervisor([ServiceSpec('api', [sys.executable, '-c', "
              f"{service!r}])], Console(io.StringIO(), ['api']), 5).run()")
    supervisor = subprocess.Popen([sys.executable, "-c", script])
    try:
        pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), timeout=20,
                           message="the service to start"))
    finally:
        supervisor.kill()
        supervisor.wait()
    wait_for(lambda: not group_alive(pid), timeout=10, message="the orphan to die")
