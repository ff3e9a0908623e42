"""`import taskline` stays cheap: the public names load from their modules on first use.

The `taskline` client commands and an application that only uses `Client` must not pay for
SQLAlchemy, psycopg and the store at start; each check runs in a fresh interpreter, since this
test process has imported everything already.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import taskline

HEAVY = ("sqlalchemy", "psycopg", "taskline.store.store", "pydantic", "flask")


def loaded_after(code: str) -> set[str]:
    """The heavy modules a fresh interpreter holds after running `code`."""
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, check=True)
    return set(done.stdout.split())


def test_import_taskline_loads_no_database_driver() -> None:
    assert loaded_after("import taskline") == set()


def test_the_client_commands_load_no_database_driver() -> None:
    assert loaded_after("import taskline_cli.main, taskline_cli.clientcmds\n"
                        "from taskline import Client, JobFailed") == set()


def test_a_name_loads_its_module_on_first_use() -> None:
    assert "sqlalchemy" in loaded_after("import taskline\ntaskline.enqueue")


def test_every_public_name_resolves_and_is_listed() -> None:
    for name in taskline.__all__:
        assert getattr(taskline, name) is not None, name
    assert set(taskline.__all__) <= set(dir(taskline))


def test_an_unknown_name_is_an_attribute_error() -> None:
    misspelt = "enqueu"
    with pytest.raises(AttributeError, match=misspelt):
        getattr(taskline, misspelt)
