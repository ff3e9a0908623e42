"""The light install: `pip install taskline` (no extras) in a fresh virtualenv, from this checkout
and the package index, has no Flask, gunicorn, PyJWT or OpenTelemetry SDK, and in it `taskline
--help`, `taskline migrate`, `taskline worker`, `taskline maintenance`, the in-transaction
enqueue (sync and async) and `Client` / `AsyncClient` work against real PostgreSQL and Redis;
`taskline api` says which extra it needs. The API the client talks to runs from the test's own
environment (the `api` extra), as it would on another host.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from taskline.settings import Settings
from taskline.store.store import Store
from taskline_cli.localservers import free_port
from tests.conftest import ADMIN_URL, db_url
from tests.helpers import service_env, stop_process, wait_for
from tests.integration.test_client_api import start_api

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "shared", "services", "migrations")
INSTALL_TIMEOUT_S = 110


@pytest.fixture(scope="module")
def light(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with `pip install <checkout>`, no extras; its bin directory."""
    base = tmp_path_factory.mktemp("light")
    source = base / "src"  # a copy: an in-tree build would leave build/ in the checkout
    source.mkdir()
    for name in SOURCES:
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy
        copy(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "venv", str(base / "venv")], check=True)
    bin_dir = base / "venv" / "bin"
    subprocess.run([str(bin_dir / "pip"), "install", "--quiet", "--disable-pip-version-check",
                    str(source)], check=True, timeout=INSTALL_TIMEOUT_S, env=_clean_env())
    return bin_dir


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment without anything pointing Python at this checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(extra)
    return env


def light_env(settings: Settings, **extra: str) -> dict[str, str]:
    env = service_env(settings, **extra)
    env.pop("PYTHONPATH", None)
    return env


def run(bin_dir: Path, args: list[str], env: dict[str, str] | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(bin_dir / args[0]), *args[1:]], capture_output=True, text=True,
                          env=env or _clean_env(), cwd=cwd or bin_dir, timeout=60)


@contextmanager
def light_service(bin_dir: Path, args: list[str], env: dict[str, str],
                  log: Path) -> Iterator[subprocess.Popen]:
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(bin_dir / "taskline"), *args], env=env, cwd=bin_dir,
                                stdout=out, stderr=subprocess.STDOUT)
        try:
            yield proc
        finally:
            stop_process(proc)


@pytest.fixture
def empty_database() -> Iterator[str]:
    name = f"taskline_light_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield db_url(name)
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(name)))


def test_no_web_stack_and_the_commands_start(light: Path, empty_database: str) -> None:
    for module in ("flask", "gunicorn", "jwt", "h11", "opentelemetry.sdk"):
        found = run(light, ["python", "-c", f"import {module}"])
        assert found.returncode != 0 and "ModuleNotFoundError" in found.stderr, module
    assert run(light, ["taskline", "--help"]).returncode == 0
    migrated = run(light, ["taskline", "migrate"], _clean_env(DATABASE_URL=empty_database))
    assert migrated.returncode == 0, migrated.stderr
    assert "is at the newest revision" in migrated.stdout
    with psycopg.connect(empty_database) as conn:
        assert conn.execute("SELECT count(*) FROM taskline.jobs").fetchone() == (0,)
    api = run(light, ["taskline", "api"])
    assert api.returncode == 2 and "pip install 'taskline[api]'" in api.stderr


ENQUEUE = """
import asyncio, sys, psycopg, taskline
from taskline.client import AsyncClient, Client

url, api = sys.argv[1], sys.argv[2]
with psycopg.connect(url) as conn:
    print(taskline.enqueue(conn, "echo", {"via": "library"}))

async def main():
    async with await psycopg.AsyncConnection.connect(url) as conn:
        print(await taskline.aenqueue(conn, "echo", {"via": "aenqueue"}))
    async with AsyncClient(api) as client:
        print((await client.enqueue("echo", {"via": "AsyncClient"}))["id"])

asyncio.run(main())
with Client(api) as client:
    print(client.enqueue("echo", {"via": "Client"})["id"])
"""


@pytest.fixture
def api_url(settings: Settings, tmp_path: Path) -> Iterator[str]:
    """The API from this environment (with the api extra), as on another host."""
    yield from start_api(settings, tmp_path / "api")


def test_worker_maintenance_enqueue_and_clients(light: Path, settings: Settings, store: Store,
                                                api_url: str, tmp_path: Path) -> None:
    # Tracing asked for without the otel extra: the processes say so and run untraced.
    env = light_env(settings, TASKLINE_METRICS_PORT=str(free_port()),
                    OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:4318")
    with light_service(light, ["worker"], env, tmp_path / "worker.log") as worker, \
            light_service(light, ["maintenance"], env, tmp_path / "maintenance.log") as maint:
        script = tmp_path / "enqueue.py"
        script.write_text(ENQUEUE)
        done = run(light, ["python", str(script), settings.database_url, api_url], env)
        assert done.returncode == 0, done.stderr
        ids = [uuid.UUID(line) for line in done.stdout.split()]
        assert len(ids) == 4
        wait_for(lambda: all(store.get_job(i).status == "succeeded" for i in ids), timeout=60,
                 message="the light install's worker to run every job")
        assert [store.get_job(i).result["via"] for i in ids] == [
            "library", "aenqueue", "AsyncClient", "Client"]
        assert worker.poll() is None and maint.poll() is None, f"see {tmp_path}"
    assert "pip install 'taskline[otel]'" in (tmp_path / "worker.log").read_text()



DRAIN = '''
import sys

import psycopg

import taskline
from taskline import testing


@taskline.handler("light.add")
def add(payload, ctx):
    if ctx.attempt == 1 and payload.get("flaky"):
        raise ConnectionError("first attempt fails")
    return {"sum": payload["a"] + payload["b"]}


url = sys.argv[1]
with psycopg.connect(url) as conn:
    taskline.enqueue(conn, "light.add", {"a": 1, "b": 2})
    taskline.enqueue(conn, "light.add", {"a": 3, "b": 4, "flaky": True})
drained = testing.drain(url)
print(drained.succeeded, drained.retried, sorted(j["result"]["sum"] for j in drained.jobs
                                                 if j.get("result")))
print(sorted(name for name in sys.modules if name.split(".")[0] in ("flask", "gunicorn")))
'''


def test_taskline_testing_drains_without_the_web_stack(light: Path, settings: Settings,
                                                        tmp_path: Path) -> None:
    """The testing module's drain, the worker's own claim, lease and outcome code, runs in the
    light install: a retried job and a plain one, without Redis, Flask or gunicorn."""
    script = tmp_path / "drain.py"
    script.write_text(DRAIN)
    done = run(light, ["python", str(script), settings.database_url], light_env(settings))
    assert done.returncode == 0, done.stderr
    counts, web = done.stdout.strip().splitlines()
    assert counts == "2 1 [3, 7]", done.stdout
    assert web == "[]"


DECLARE = """
import dataclasses
import taskline

@dataclasses.dataclass
class Receipt:
    order: int

try:
    @taskline.handler("send_receipt", payload=Receipt)
    def send(payload, ctx):
        pass
except ImportError as err:
    print(err)
"""


def test_a_declared_payload_without_pydantic_names_the_extra(light: Path,
                                                             tmp_path: Path) -> None:
    """pydantic stays optional: the light install has none, a handler without `payload=`
    registers, and one declaring a dataclass payload fails at import naming the extra."""
    script = tmp_path / "declare.py"
    script.write_text(DECLARE)
    done = run(light, ["python", str(script)])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "payload=Receipt: declared payloads need pydantic: pip install 'taskline[pydantic]'")
    plain = run(light, ["python", "-c", "import taskline\n@taskline.handler('t')\n"
                        "def f(payload, ctx): pass\nimport importlib.util as u\n"
                        "print(u.find_spec('pydantic'))"])
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.strip() == "None"
