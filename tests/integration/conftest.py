"""Fixtures shared by the integration tests: the Flask app over the test's servers, a closed
port, and a clean registry of the worker tests' handlers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from flask import Flask
from flask.testing import FlaskClient

from taskline.settings import Settings
from taskline_cli.localservers import free_port
from taskline_producer.app import close_app, create_app
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
