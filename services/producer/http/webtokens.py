"""JWT bearer tokens (RFC 7519), verified with PyJWT beside the static tokens.

Invariant: the algorithm is the configured one (TASKLINE_JWT_ALGORITHM) and never the one a
token's header names, so `alg: none` and algorithm confusion (an RS256 public key used as an
HS256 secret) are refused; `exp` and `sub` are required, `exp` and `nbf` are checked with
TASKLINE_JWT_LEEWAY_S of clock skew, `aud` against TASKLINE_JWT_AUDIENCE (a token carrying
`aud` is refused when none is configured) and `iss` against TASKLINE_JWT_ISSUER when set;
`exp`, `nbf` and `iat`, where present, are JSON numbers of seconds from 1970 to the end of
9999 (a string, a boolean or 1e30 is refused). The key is loaded and checked at start-up; keys
from a JWKS URL are fetched, and cached, by PyJWKClient. A refused token is a 401 whose message
says why, never what the token held: PyJWT's own message is passed on only when it is one of
the fixed sentences known to quote nothing of the token (some quote its `kid` or `alg`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from taskline.access import scopes_of_claim
from taskline.errors import ConfigError
from taskline.settings import Settings

JWKS_TIMEOUT_S = 5.0
"""How long a JWKS fetch may take before the request is answered 503, seconds."""
JWKS_LIFESPAN_S = 300.0
"""How long a fetched JWK Set is used before it is fetched again, seconds."""
MAX_SUBJECT_CHARS = 255
TIME_CLAIMS = ("exp", "nbf", "iat")
MAX_NUMERIC_DATE = 253_402_300_799
"""9999-12-31T23:59:59Z, the last second a date can name: later `exp`/`nbf`/`iat` are refused."""
_REQUIRED = ("exp", "sub")
# PyJWT's messages that quote nothing of the token; any other is replaced (_reason).
_FIXED_MESSAGES = frozenset({
    "Signature has expired", "The token is not yet valid (nbf)",
    "The token is not yet valid (iat)", "Audience doesn't match", "Invalid audience",
    "Invalid issuer", "Signature verification failed", "The specified alg value is not allowed",
    "Expiration Time claim (exp) must be an integer.",
    "Not Before claim (nbf) must be an integer.", "Issued At claim (iat) must be an integer.",
    *(f'Token is missing the "{claim}" claim' for claim in (*_REQUIRED, "aud", "iss")),
})
# What a refusal says when PyJWT's message is not one of those, by exception class (the
# first that matches: InvalidSignatureError is a DecodeError).
_REASONS = (
    (jwt.ExpiredSignatureError, "Signature has expired"),
    (jwt.ImmatureSignatureError, "The token is not yet valid"),
    (jwt.InvalidAudienceError, "Audience doesn't match"),
    (jwt.InvalidIssuerError, "Invalid issuer"),
    (jwt.InvalidSignatureError, "Signature verification failed"),
    (jwt.InvalidAlgorithmError, "The specified alg value is not allowed"),
    (jwt.MissingRequiredClaimError, "a required claim is missing"),
    (jwt.PyJWKClientError, "no key of TASKLINE_JWT_JWKS_URL matches the token"),
    (jwt.DecodeError, "the token is not a well-formed JWT"),
)


class InvalidJwt(Exception):
    """The JWT is not valid; the message says why (expired, wrong audience, bad signature)."""


class JwksUnavailable(Exception):
    """The JWK Set could not be fetched, so no JWT can be verified now."""


@dataclass(frozen=True)
class Claims:
    """What taskline takes from a verified JWT."""

    subject: str
    scopes: frozenset[str]
    issuer: str | None = None
    """`iss` when the token carries a string one: a `sub` is unique only within its issuer."""


def _public_key(pem: str, algorithm: str) -> Any:
    """The PEM public key of TASKLINE_JWT_KEY, checked to suit `algorithm`."""
    text = pem.replace("\\n", "\n") if "\n" not in pem else pem
    try:
        key = load_pem_public_key(text.encode("ascii"))
    except (ValueError, UnicodeError):
        raise ConfigError("TASKLINE_JWT_KEY is not a PEM public key") from None
    wanted = rsa.RSAPublicKey if algorithm == "RS256" else ec.EllipticCurvePublicKey
    if not isinstance(key, wanted):
        raise ConfigError(f"TASKLINE_JWT_KEY is not a key for {algorithm}")
    if isinstance(key, ec.EllipticCurvePublicKey) and not isinstance(key.curve, ec.SECP256R1):
        raise ConfigError("an ES256 TASKLINE_JWT_KEY is a P-256 key")
    if isinstance(key, rsa.RSAPublicKey) and key.key_size < 2048:
        raise ConfigError("an RS256 TASKLINE_JWT_KEY has at least 2048 bits")
    return key


class JwtVerifier:
    """Verifies JWTs with one configured algorithm and key (or JWK Set)."""

    def __init__(self, settings: Settings) -> None:
        self.algorithm = settings.jwt_algorithm
        self.audience = settings.jwt_audience or None
        self.issuer = settings.jwt_issuer or None
        self.leeway_s = settings.jwt_leeway_s
        self._jwks: jwt.PyJWKClient | None = None
        self._key: Any = None
        if settings.jwt_jwks_url:
            self._jwks = jwt.PyJWKClient(settings.jwt_jwks_url, cache_keys=True,
                                         lifespan=JWKS_LIFESPAN_S, timeout=JWKS_TIMEOUT_S)
        elif self.algorithm == "HS256":
            self._key = settings.jwt_key.encode("utf-8")
        else:
            self._key = _public_key(settings.jwt_key, self.algorithm)

    def verify(self, token: str) -> Claims:
        """The claims of a valid token; InvalidJwt or JwksUnavailable otherwise."""
        try:
            claims = jwt.decode(
                token, self._signing_key(token), algorithms=[self.algorithm],
                audience=self.audience, issuer=self.issuer, leeway=self.leeway_s,
                options={"require": list(_REQUIRED), "enforce_minimum_key_length": True})
        except jwt.PyJWKClientConnectionError:
            raise JwksUnavailable("the JWT keys (TASKLINE_JWT_JWKS_URL) cannot be fetched") \
                from None
        except jwt.PyJWTError as err:
            raise InvalidJwt(_reason(err)) from None
        _check_times(claims)
        subject = claims["sub"]
        if not isinstance(subject, str) or not 1 <= len(subject) <= MAX_SUBJECT_CHARS \
                or not subject.isprintable():
            raise InvalidJwt(f"sub must be 1..{MAX_SUBJECT_CHARS} printable characters")
        issuer = claims.get("iss")
        return Claims(subject, scopes_of_claim(claims.get("scope")),
                      issuer if isinstance(issuer, str) else None)

    def _signing_key(self, token: str) -> Any:
        if self._jwks is None:
            return self._key
        return self._jwks.get_signing_key_from_jwt(token).key


def _reason(err: jwt.PyJWTError) -> str:
    """Why PyJWT refused a token, in words that quote nothing of it."""
    if str(err) in _FIXED_MESSAGES:
        return str(err)
    return next((reason for kind, reason in _REASONS if isinstance(err, kind)),
                "the token is not valid")


def _check_times(claims: dict[str, Any]) -> None:
    """`exp`, `nbf` and `iat` are numbers of seconds within the dates a calendar can name.

    PyJWT compares `int(value)`, so the string "9999999999" or 1e30 (a token that never
    expires) would pass it.
    """
    for name in (claim for claim in TIME_CLAIMS if claim in claims):
        value = claims[name]
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not (number and math.isfinite(value) and 0 <= value <= MAX_NUMERIC_DATE):
            raise InvalidJwt(f"{name} must be a number of seconds since 1970, "
                             f"0..{MAX_NUMERIC_DATE}")
