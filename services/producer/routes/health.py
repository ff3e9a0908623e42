"""Liveness, readiness and the Prometheus scrape; open even when API tokens are configured.

Invariant: /healthz does no I/O (a live process answers it even when its dependencies are
down, so an orchestrator does not restart it for their outage); /readyz answers 200 whenever
PostgreSQL answers, since that is all accepting a job needs (a Redis outage slows dispatch and
stops nothing: the status is then "degraded"), and 503 when PostgreSQL does not; it says
which dependency did not answer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from flask import Blueprint, Response, jsonify

from taskline.errors import TasklineError
from taskline_producer.http import exposition
from taskline_producer.operations import reads

log = logging.getLogger(__name__)

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz() -> Response:
    return jsonify({"status": "ok"})


@bp.get("/readyz")
def readyz() -> Response:
    checks = {name: _check(ping) for name, ping in reads.reachability().items()}
    ready = checks["postgresql"] == "ok"
    status = "unavailable" if not ready else "ready" if checks["redis"] == "ok" else "degraded"
    response = jsonify({"status": status, "checks": checks})
    response.status_code = 200 if ready else 503
    return response


def _check(ping: Callable[[], None]) -> str:
    """"ok", or why not: any failure of a probe means not ready, never a 500."""
    try:
        ping()
    except TasklineError as err:
        return str(err)
    except Exception as err:
        log.warning("readiness probe failed", exc_info=True)
        return f"unavailable: {type(err).__name__}"
    return "ok"


@bp.get("/metrics")
def metrics() -> Response:
    return exposition.exposition()
