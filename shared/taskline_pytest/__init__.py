"""taskline's pytest plugin (registered through the `pytest11` entry point): the `taskline_db`
fixture, and the instant each test begins, from which taskline.testing.enqueued counts a test's
jobs.

Loaded into every pytest run of an environment where taskline is installed, so it imports
nothing but the standard library and pytest until a test asks for `taskline_db`: taskline,
SQLAlchemy and psycopg are imported then.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

test_began: float | None = None
"""When the running test's setup began (Unix time): taskline.testing.enqueued's default start."""


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    global test_began
    test_began = time.time()


@pytest.fixture(scope="session")
def _taskline_session_db() -> Iterator[Any]:
    from taskline.testing.database import provide

    database = provide()
    try:
        yield database
    finally:
        database.close()


@pytest.fixture
def taskline_db(_taskline_session_db: Any) -> Iterator[Any]:
    """A migrated taskline database (taskline.testing.database.TestDatabase: `url`,
    `sqlalchemy_url`, `connect()`), shared by the session; every row a test wrote to taskline's
    tables is gone after it."""
    try:
        yield _taskline_session_db
    finally:
        _taskline_session_db.empty()
