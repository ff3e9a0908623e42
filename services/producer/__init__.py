"""taskline's producer service: the HTTP API that accepts, queries, cancels and requeues jobs.

Invariant: a job is committed to PostgreSQL before its id reaches Redis, and no input, however
malformed, is answered with a 500; `create_app` is the Flask app factory, `http.serve.run` runs
it under gunicorn. The package is in layers (docs/architecture.md, "The API in layers"): `http`
(the server), `routes` (the blueprints), `schemas` (requests and answers) and `operations` (the
use cases).

`create_app` is imported lazily: importing `taskline_producer.http.serve` must not import
prometheus-client before `serve.run` has prepared PROMETHEUS_MULTIPROC_DIR.
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from taskline_producer.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
