"""Fixtures shared by the integration tests: the Flask app over the test's servers, a closed
port, a clean registry of the worker tests' handlers, and one database and `taskline api` per
module for the client and command-line modules, whose tests would otherwise spend most of their
time starting an API each."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from flask import Flask
from flask.testing import FlaskClient

from taskline.settings import Settings
from taskline_cli.localservers import free_port
from taskline_producer.app import close_app, create_app
from tests.conftest import REDIS_URL, cloned_database, flush_redis, short_settings
from tests.helpers import start_api
from tests.integration import worker_handlers


@pytest.fixture
def app(settings: Settings) -> Iterator[Flask]:
    """The producer app on the test's database and Redis, closed after the test."""
    app = create_app(settings)
    yield app
    close_app(app)


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


@pytest.fixture
def unused_port() -> int:
    """A loopback port nothing listens on: a server that is down."""
    return free_port()


@pytest.fixture
def clean_handlers() -> Iterator[None]:
    """The worker tests' handlers start and end with no recorded calls or gates."""
    worker_handlers.reset()
    yield
    worker_handlers.reset()


@pytest.fixture(scope="module")
def module_settings(template_db: str) -> Iterator[Settings]:
    """Settings over a database the module's tests share. A module that uses them overrides
    `settings` with them, so `store` and `dispatcher` see the API's database; its tests then
    name their queues, types and scopes apart, or filter, where they assert on a whole list.
    Redis is still flushed around each test by `redis_url`."""
    with cloned_database(template_db) as url:
        flush_redis()
        yield short_settings(url, REDIS_URL)
        flush_redis()


@pytest.fixture(scope="module")
def module_api_url(module_settings: Settings,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One `taskline api` over `module_settings` for the whole module."""
    yield from start_api(module_settings, tmp_path_factory.mktemp("api") / "logs")
