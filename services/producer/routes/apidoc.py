"""Serves the OpenAPI 3.1 document of the API (openapi.json, shipped in this package).

Invariant: the document describes exactly what the routes accept and return; when
authentication is on (API tokens or a JWT key configured) it declares the bearer scheme on
every /api/v1 operation, and only then.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from importlib import resources
from typing import Any

from flask import Blueprint, Response, jsonify

from taskline_producer.operations.backends import backends

bp = Blueprint("apidoc", __name__, url_prefix="/api/v1")

OPEN_PATHS = ("/healthz", "/readyz", "/metrics")


@cache
def document() -> dict[str, Any]:
    """The packaged document, without security: parsed once per process."""
    text = resources.files("taskline_producer").joinpath("openapi.json").read_text("utf-8")
    return json.loads(text)


def with_security(doc: dict[str, Any]) -> dict[str, Any]:
    """A copy of `doc` that requires the bearer scheme everywhere but the open health routes."""
    secured = copy.deepcopy(doc)
    secured.setdefault("components", {})["securitySchemes"] = {
        "bearer": {"type": "http", "scheme": "bearer",
                   "description": "A token of TASKLINE_API_TOKENS or a JWT; each route "
                                  "needs one scope (x-required-scope)."}}
    secured["security"] = [{"bearer": []}]
    for path in OPEN_PATHS:
        for operation in secured["paths"].get(path, {}).values():
            operation["security"] = []
    return secured


@bp.get("/openapi.json")
def openapi() -> Response:
    doc = document()
    return jsonify(with_security(doc) if backends().settings.auth_enabled else doc)
