"""The API's error classes and the handlers that render every failure as the error shape.

Invariant: every response that is not a success is `{"error": {"code", "message", "details"}}`
with a status from this module; an exception nobody anticipated becomes a logged 500 with the
same shape (a 500 is always a bug), PostgreSQL or Redis being unreachable becomes a 503 with
Retry-After.
"""

from __future__ import annotations

import logging
from typing import Any

from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import HTTPException

from taskline.errors import DispatchUnavailable, IdempotencyConflict, StoreUnavailable

log = logging.getLogger(__name__)

RETRY_AFTER_S = 5
_HTTP_CODES = {413: "payload_too_large"}
_PASSED_HEADERS = ("allow", "www-authenticate", "retry-after")


class ApiError(Exception):
    """The request cannot be served."""

    status = 400
    code = "bad_request"

    def __init__(self, message: str | None = None, details: Any = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())
        self.message = str(self.args[0])
        self.details = details
        self.headers = headers or {}


class InvalidJson(ApiError):
    """The request body is not valid JSON."""

    code = "invalid_json"


class DuplicateKey(ApiError):
    """The request body repeats a key inside one JSON object."""

    code = "duplicate_key"


class NonFiniteNumber(ApiError):
    """The request body holds NaN, Infinity or a number too large for a double."""

    code = "non_finite_number"


class NestingTooDeep(ApiError):
    """The request body is nested too deeply."""

    code = "nesting_too_deep"


class InvalidString(ApiError):
    """The request body holds a NUL character or a lone surrogate, which PostgreSQL cannot store."""

    code = "invalid_string"


class InvalidParameter(ApiError):
    """A query parameter is invalid."""

    code = "invalid_parameter"


class Unauthorized(ApiError):
    """A valid bearer token is required."""

    status = 401
    code = "unauthorized"


class NotFound(ApiError):
    """No job has this id."""

    status = 404
    code = "not_found"


class InvalidState(ApiError):
    """The job is not in a state that allows this action."""

    status = 409
    code = "invalid_state"


class PayloadTooLarge(ApiError):
    """The request body is larger than the configured limit."""

    status = 413
    code = "payload_too_large"


class UnsupportedMediaType(ApiError):
    """The request body must be sent as application/json."""

    status = 415
    code = "unsupported_media_type"


class ValidationFailed(ApiError):
    """The request has invalid fields."""

    status = 422
    code = "validation_failed"


def error_response(status: int, code: str, message: str, details: Any = None,
                   headers: dict[str, str] | None = None) -> Response:
    response = jsonify({"error": {"code": code, "message": message, "details": details}})
    response.status_code = status
    response.headers.update(headers or {})
    return response


def _api_error(err: ApiError) -> Response:
    return error_response(err.status, err.code, err.message, err.details, err.headers)


def _http_error(err: HTTPException) -> Response:
    """Flask's own errors (404 and 405 from routing, 413 from the body limit) in our shape."""
    status = err.code or 500
    code = _HTTP_CODES.get(status, (err.name or "error").lower().replace(" ", "_"))
    passed = {k: v for k, v in err.get_headers() if k.lower() in _PASSED_HEADERS}
    return error_response(status, code, err.description or err.name, None, passed)


def _idempotency_conflict(err: IdempotencyConflict) -> Response:
    """The IETF Idempotency-Key draft: a key reused with another body is a 422."""
    return error_response(422, "idempotency_key_reused", str(err))


def _unavailable(err: Exception) -> Response:
    code = "store_unavailable" if isinstance(err, StoreUnavailable) else "dispatch_unavailable"
    log.warning("answering 503", extra={"path": request.path, "error": str(err)})
    return error_response(503, code, str(err), None, {"Retry-After": str(RETRY_AFTER_S)})


def _unexpected(err: Exception) -> Response:
    log.error("unhandled error", exc_info=err, extra={"path": request.path,
                                                      "method": request.method})
    return error_response(500, "internal_error", "internal error; it has been logged")


def init_app(app: Flask) -> None:
    """Register one handler per error class; Flask picks the most specific one."""
    app.register_error_handler(ApiError, _api_error)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(IdempotencyConflict, _idempotency_conflict)
    app.register_error_handler(StoreUnavailable, _unavailable)
    app.register_error_handler(DispatchUnavailable, _unavailable)
    app.register_error_handler(Exception, _unexpected)
