"""Authentication and scopes of /api/v1/* (RFC 6750 bearer tokens: static or JWT).

Invariant: when authentication is on (any token or a JWT key configured), a request to /api/*
is answered 401 before any route runs unless it carries a valid token (unknown paths too, so
routes are not revealed), and 403 `forbidden`, naming the scope, unless the token holds the
scope taskline_producer.http.scopes assigns to the route. The principal (who, with which scopes) is
`flask.g.principal` for the rest of the request (`principal()`); its name is the actor of what
the request does. Static tokens are compared with hmac.compare_digest against every configured
token, without stopping at the first match, so timing says nothing about which one or how much
matched. The event stream alone also accepts the token as `?token=`, because EventSource cannot
send headers; no API response is ever sent a Referer (Referrer-Policy), no log line holds a
query string, and no token is ever logged.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from dataclasses import dataclass

from flask import Blueprint, Flask, Response, current_app, g, jsonify, request

from taskline.access import SCOPES, StaticToken, parse_tokens
from taskline.settings import Settings
from taskline_producer.http import scopes
from taskline_producer.http.webtokens import InvalidJwt, JwksUnavailable, JwtVerifier
from taskline_producer.schemas.errors import ApiError, Unauthorized

PROTECTED_PREFIX = "/api/"
REALM = 'Bearer realm="taskline"'
# EventSource cannot send headers, so the event stream (only) also takes `?token=`.
QUERY_TOKEN_PATHS = frozenset({"/api/v1/events"})
AUTHENTICATOR = "taskline_authenticator"
"""The app extension holding the Authenticator (absent when authentication is off)."""
JWKS_RETRY_AFTER_S = 5

bp = Blueprint("access", __name__, url_prefix="/api/v1")


class Forbidden(ApiError):
    """The token does not hold the scope this route needs."""

    status = 403
    code = "forbidden"


class KeysUnavailable(ApiError):
    """The keys JWTs are verified with cannot be fetched now."""

    status = 503
    code = "jwks_unavailable"


@dataclass(frozen=True)
class Principal:
    """Who is calling: a token's name or a JWT's `sub`, and the scopes granted to it."""

    name: str | None
    scopes: frozenset[str]
    kind: str
    """`token`, `jwt`, or `anonymous` when authentication is off."""
    issuer: str | None = None
    """A JWT's `iss` (None for a static token)."""

    @property
    def key_scope(self) -> str | None:
        """Whose idempotency keys this principal's are (taskline.jobs.scoped_key); None for
        the one scope shared by the library and a deployment without authentication."""
        if self.kind == "anonymous" or self.name is None:
            return None
        if self.kind == "jwt":
            return f"jwt:{self.issuer or ''}:{self.name}"
        return f"{self.kind}:{self.name}"


ANONYMOUS = Principal(None, SCOPES, "anonymous")


def principal() -> Principal:
    """The principal of the current request (anonymous, with every scope, when auth is off)."""
    return g.get("principal", ANONYMOUS)


def token_matches(presented: str, tokens: Sequence[bytes]) -> bool:
    """True when `presented` equals one of `tokens`; every token is compared."""
    return matching_index(presented, tokens) is not None


def matching_index(presented: str, tokens: Sequence[bytes]) -> int | None:
    """The index of the token `presented` equals, or None; every token is compared."""
    candidate = presented.encode("utf-8", "surrogateescape")
    found = None
    for i, token in enumerate(tokens):
        if hmac.compare_digest(candidate, token):
            found = i
    return found


def bearer_token(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (scheme case-insensitive)."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def _invalid(message: str) -> Unauthorized:
    return Unauthorized(message, headers={"WWW-Authenticate": f'{REALM}, error="invalid_token"'})


class Authenticator:
    """Turns a presented bearer token into a Principal, or refuses it."""

    def __init__(self, settings: Settings) -> None:
        self._tokens: list[StaticToken] = parse_tokens(settings.api_tokens)
        self._secrets = [t.secret for t in self._tokens]
        self._jwt = JwtVerifier(settings) if settings.jwt_enabled else None

    def principal_for(self, token: str) -> Principal:
        index = matching_index(token, self._secrets)
        if index is not None:
            static = self._tokens[index]
            return Principal(static.name, static.scopes, "token")
        if self._jwt is None or token.count(".") != 2:
            raise _invalid("the bearer token is not valid")
        try:
            claims = self._jwt.verify(token)
        except InvalidJwt as err:
            raise _invalid(f"the bearer token is not a valid JWT: {err}") from None
        except JwksUnavailable as err:
            raise KeysUnavailable(str(err),
                                  headers={"Retry-After": str(JWKS_RETRY_AFTER_S)}) from None
        return Principal(claims.subject, claims.scopes, "jwt", claims.issuer)


def _presented_token() -> str | None:
    token = bearer_token(request.headers.get("Authorization"))
    if token is None and request.path in QUERY_TOKEN_PATHS:
        token = request.args.get("token") or None
    return token


def _require_scope(who: Principal) -> None:
    rule = request.url_rule
    if rule is None or rule.endpoint is None:
        return  # no route: routing answers 404 or 405 next
    missing = scopes.allowed(rule.endpoint, who.scopes)
    if missing is not None:
        raise Forbidden(f"this token lacks the scope {missing}",
                        {"scope": missing, "granted": sorted(who.scopes)})


def answer_headers(path: str) -> list[tuple[str, str]]:
    """The headers every answer to `path` carries (an answer written without Flask too)."""
    # A token in the event stream's URL must never travel to another site in a Referer.
    return [("Referrer-Policy", "no-referrer")] if path.startswith(PROTECTED_PREFIX) else []


def _no_referrer(response: Response) -> Response:
    for name, value in answer_headers(request.path):
        response.headers.setdefault(name, value)
    return response


def presented_token() -> str | None:
    """The current request's bearer token when authentication is on (None when it is off)."""
    return _presented_token() if AUTHENTICATOR in current_app.extensions else None


def still_allowed(app: Flask, token: str | None, endpoint: str) -> bool:
    """Whether `token` (presented_token's) may still call `endpoint`: a request answered
    outside Flask (a woken waiter's) is checked again, as a run of its request would be; any
    refusal is left to that run, which answers it in the error shape."""
    authenticator = app.extensions.get(AUTHENTICATOR)
    if authenticator is None:
        return True
    if token is None:
        return False
    try:
        who = authenticator.principal_for(token)
    except Exception:
        return False
    return scopes.allowed(endpoint, who.scopes) is None


def init_app(app: Flask, settings: Settings) -> None:
    """Check every /api/ request when any token or a JWT key is configured."""
    app.after_request(_no_referrer)
    if not settings.auth_enabled:
        return
    authenticator = Authenticator(settings)
    app.extensions[AUTHENTICATOR] = authenticator

    @app.before_request
    def authenticate() -> None:
        if not request.path.startswith(PROTECTED_PREFIX):
            return
        token = _presented_token()
        if token is None:
            raise Unauthorized("a bearer token is required", headers={"WWW-Authenticate": REALM})
        g.principal = authenticator.principal_for(token)
        _require_scope(g.principal)


@bp.get("/whoami")
def whoami() -> Response:
    """Who the presented token names and what it may do (the dashboard enables buttons by it)."""
    who = principal()
    return jsonify({"name": who.name, "kind": who.kind, "scopes": sorted(who.scopes),
                    "authentication": who.kind != "anonymous"})
