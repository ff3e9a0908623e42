"""Bearer-token authentication of /api/v1/* (RFC 6750), on when any token is configured.

Invariant: a request to /api/v1/* without one of the configured tokens gets a 401 with
`WWW-Authenticate: Bearer realm="taskline"` before any route runs (unknown paths too, so routes
are not revealed); the event stream alone also accepts the token as `?token=`, because
EventSource cannot send headers. Tokens are compared with hmac.compare_digest against every
configured token, without stopping at the first match, so timing says nothing about which one
or how much matched.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from flask import Flask, request

from taskline_producer.errors import Unauthorized

PROTECTED_PREFIX = "/api/"
REALM = 'Bearer realm="taskline"'
# EventSource cannot send headers, so the event stream (only) also takes `?token=`.
QUERY_TOKEN_PATHS = frozenset({"/api/v1/events"})


def token_matches(presented: str, tokens: Sequence[bytes]) -> bool:
    """True when `presented` equals one of `tokens`; every token is compared."""
    candidate = presented.encode("utf-8", "surrogateescape")
    matched = False
    for token in tokens:
        matched |= hmac.compare_digest(candidate, token)
    return matched


def bearer_token(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (scheme case-insensitive)."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def init_app(app: Flask, tokens: Sequence[str]) -> None:
    if not tokens:
        return
    encoded = [t.encode("utf-8") for t in tokens]

    @app.before_request
    def require_token() -> None:
        if not request.path.startswith(PROTECTED_PREFIX):
            return
        token = bearer_token(request.headers.get("Authorization"))
        if token is None and request.path in QUERY_TOKEN_PATHS:
            token = request.args.get("token") or None
        if token is None:
            raise Unauthorized("a bearer token is required", headers={"WWW-Authenticate": REALM})
        if not token_matches(token, encoded):
            raise Unauthorized("the bearer token is not valid", headers={
                "WWW-Authenticate": f'{REALM}, error="invalid_token"'})
