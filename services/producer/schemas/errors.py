"""The API's error classes and the handlers that render every failure as the error shape.

Invariant: every response that is not a success is `{"error": {"code", "message", "details"}}`
with a status from this module; an exception nobody anticipated becomes a logged 500 with the
same shape (a 500 is always a bug), PostgreSQL or Redis being unreachable becomes a 503 with
Retry-After. An error raised because the request's body was not (or could not be) read in full
sets CLOSE_CONNECTION, so its answer says `Connection: close` (taskline_producer.http.intake): the
rest of that body must never be taken for the client's next request.
"""

from __future__ import annotations

import json
import logging
from http import HTTPStatus
from typing import Any

from flask import Flask, Response, current_app, jsonify, request
from werkzeug.exceptions import HTTPException

from taskline.errors import (
    AlreadyStarted,
    DispatchUnavailable,
    IdempotencyConflict,
    QueueLimitReached,
    StoreUnavailable,
)

log = logging.getLogger(__name__)

RETRY_AFTER_S = 5
# The WSGI environ key a response sets to close its connection after the answer.
CLOSE_CONNECTION = "taskline.close_connection"
_PASSED_HEADERS = ("allow", "www-authenticate", "retry-after")


class ApiError(Exception):
    """The request cannot be served."""

    status = 400
    code = "bad_request"
    closes_connection = False
    """Whether the answer closes the connection: the body was not read to its end."""

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


class InvalidFraming(ApiError):
    """The request body is not framed as HTTP/1.1 requires (chunks or Content-Length)."""

    code = "invalid_framing"
    closes_connection = True


class InvalidIdempotencyKey(ApiError):
    """An idempotency key must be 1..255 visible ASCII characters (an sf-string in the header)."""

    code = "invalid_idempotency_key"


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
    closes_connection = True


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


def error_bytes(status: int, code: str, message: str) -> bytes:
    """A whole HTTP/1.1 error answer that closes its connection, for the server to write
    itself (before or outside the application: framing refused, deadline missed)."""
    body = json.dumps({"error": {"code": code, "message": message, "details": None}}).encode()
    head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode("ascii") + body


def _close_connection() -> None:
    """Ask the server to close this request's connection after the answer."""
    wsgi_env = request.environ  # the request's WSGI environ, not the process environment
    wsgi_env[CLOSE_CONNECTION] = True


def _api_error(err: ApiError) -> Response:
    if err.closes_connection:
        _close_connection()
    return error_response(err.status, err.code, err.message, err.details, err.headers)


def _http_error(err: HTTPException) -> Response:
    """Flask's own errors (404 and 405 from routing, 413 from the body limit) in our shape."""
    status = err.code or 500
    if status == 413:  # werkzeug's body limit: the body is left unread
        limit = current_app.config.get("TASKLINE_MAX_PAYLOAD_BYTES")
        return _api_error(PayloadTooLarge(details={"limit_bytes": limit}))
    code = (err.name or "error").lower().replace(" ", "_")
    passed = {k: v for k, v in err.get_headers() if k.lower() in _PASSED_HEADERS}
    return error_response(status, code, err.description or err.name, None, passed)


def _idempotency_conflict(err: IdempotencyConflict) -> Response:
    """The IETF Idempotency-Key draft: a key reused with another body is a 422."""
    return error_response(422, "idempotency_key_reused", str(err))


def _already_started(err: AlreadyStarted) -> Response:
    """on_conflict "replace" found its unique key's job started: nothing was written."""
    return error_response(409, "already_started", str(err),
                          {"id": err.job_id, "status": err.status})


def _queue_limit(err: QueueLimitReached) -> Response:
    """A job for one queue more than TASKLINE_MAX_QUEUES allows: nothing was written."""
    return error_response(422, "queue_limit", err.errors[0]["message"],
                          {"limit": err.limit, "queues": err.queues})


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
    app.register_error_handler(QueueLimitReached, _queue_limit)
    app.register_error_handler(AlreadyStarted, _already_started)
    app.register_error_handler(StoreUnavailable, _unavailable)
    app.register_error_handler(DispatchUnavailable, _unavailable)
    app.register_error_handler(Exception, _unexpected)
