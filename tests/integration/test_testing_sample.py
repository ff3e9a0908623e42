"""docs/testing.md's sample project, built from the page's code blocks in a temporary directory
and tested as a user would: its own pyproject.toml, a fresh virtualenv with `pip install` of
this checkout and of the project, then `pytest` with the taskline_db fixture of the installed
plugin, once on TASKLINE_TEST_DATABASE_URL and once on the private PostgreSQL it starts."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from taskline.localservers import postgres_bindir

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "testing.md"
SOURCES = ("pyproject.toml", "README.md", "shared", "services", "migrations")
INSTALL_TIMEOUT_S = 240
PYTEST_TIMEOUT_S = 180
BLOCK = re.compile(r"```(?:python|toml)\n# (\S+)\n(.*?)```", re.S)
FILES = ["pyproject.toml", "shop/__init__.py", "shop/jobs.py", "shop/orders.py",
         "tests/conftest.py", "tests/test_receipts.py"]
TESTS = 7


def sample_files() -> dict[str, str]:
    """{path: text} of each block of docs/testing.md whose first line names a file."""
    return {path: f"# {path}\n{body}" for path, body in BLOCK.findall(DOC.read_text())}


def test_the_page_holds_the_whole_project():
    assert sorted(sample_files()) == sorted(FILES)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the sample project's directory, its virtualenv's bin directory), installed."""
    base = tmp_path_factory.mktemp("sample")
    source = base / "taskline-src"  # a copy: an in-tree build would leave build/ behind
    source.mkdir()
    for name in SOURCES:
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy
        copy(ROOT / name, source / name)
    shop = base / "shop"
    for path, text in sample_files().items():
        (shop / path).parent.mkdir(parents=True, exist_ok=True)
        (shop / path).write_text(text)
    subprocess.run([sys.executable, "-m", "venv", str(base / "venv")], check=True)
    bin_dir = base / "venv" / "bin"
    subprocess.run([str(bin_dir / "pip"), "install", "--quiet", "--disable-pip-version-check",
                    str(source), str(shop)], check=True, timeout=INSTALL_TIMEOUT_S,
                   env=clean_env())
    return shop, bin_dir


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without this checkout on Python's path or a taskline setting."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME") and not k.startswith("TASKLINE_")}
    return env | extra


def run_pytest(project: tuple[Path, Path], env: dict[str, str]) -> str:
    shop, bin_dir = project
    done = subprocess.run([str(bin_dir / "pytest"), "-q", "-p", "no:cacheprovider"], cwd=shop,
                          capture_output=True, text=True, env=env, timeout=PYTEST_TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_sample_passes_on_the_database_it_is_given(project, database_url):
    out = run_pytest(project, clean_env(TASKLINE_TEST_DATABASE_URL=database_url))
    assert f"{TESTS} passed" in out


@pytest.mark.skipif(postgres_bindir() is None, reason="PostgreSQL's server programs are absent")
def test_the_sample_passes_on_a_private_postgresql_it_starts(project):
    out = run_pytest(project, clean_env())
    assert f"{TESTS} passed" in out


def test_loading_the_plugin_imports_nothing_heavy(project):
    _shop, bin_dir = project
    probe = ("import sys, taskline_pytest; "
             "print(sorted(m for m in ('taskline', 'sqlalchemy', 'psycopg') if m in sys.modules))")
    done = subprocess.run([str(bin_dir / "python"), "-c", probe], capture_output=True,
                          text=True, env=clean_env(), timeout=30, check=True)
    assert done.stdout.strip() == "[]"
