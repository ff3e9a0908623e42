"""Fixtures shared by the API's integration tests: the Flask app over the test's servers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from flask import Flask
from flask.testing import FlaskClient

from taskline.settings import Settings
from taskline_producer.app import close_app, create_app


@pytest.fixture
def app(settings: Settings) -> Iterator[Flask]:
    """The producer app on the test's database and Redis, closed after the test."""
    app = create_app(settings)
    yield app
    close_app(app)


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()
