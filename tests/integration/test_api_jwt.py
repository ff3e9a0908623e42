"""JWT bearer tokens: HS256, RS256 and ES256 keys, a JWKS URL, and every way a token is refused.

Tokens are made with PyJWT and real keys generated per module; the JWKS is served by a local
HTTP server. A refused token is a 401 in the error shape and changes nothing.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from flask import Flask
from flask.testing import FlaskClient

from taskline.errors import ConfigError
from taskline.settings import Settings
from taskline_producer.app import close_app, create_app

SECRET = "an-hs256-secret-of-at-least-32-bytes!"
AUDIENCE = "taskline-api"
ISSUER = "https://issuer.example"


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def ec_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def pem(private: Any) -> str:
    return private.public_key().public_bytes(Encoding.PEM,
                                             PublicFormat.SubjectPublicKeyInfo).decode()


def claims(**changes: Any) -> dict[str, Any]:
    now = int(time.time())
    base = {"sub": "ingest-service", "scope": "jobs:write jobs:read", "exp": now + 300,
            "nbf": now - 5, "iat": now, "aud": AUDIENCE, "iss": ISSUER}
    base.update(changes)
    return {k: v for k, v in base.items() if v is not None}


@pytest.fixture
def make_client(settings: Settings) -> Iterator[Any]:
    made: list[Flask] = []

    def make(**changes: Any) -> FlaskClient:
        made.append(create_app(settings.replace(
            jwt_audience=AUDIENCE, jwt_issuer=ISSUER, **changes)))
        return made[-1].test_client()

    yield make
    for app in made:
        close_app(app)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def assert_refused(client: FlaskClient, token: str, why: str | None = None) -> None:
    r = client.post("/api/v1/jobs", json={"type": "echo"}, headers=bearer(token))
    assert r.status_code == 401, r.get_json()
    error = r.get_json()["error"]
    assert error["code"] == "unauthorized" and set(error) == {"code", "message", "details"}
    assert r.headers["WWW-Authenticate"] == 'Bearer realm="taskline", error="invalid_token"'
    if why:
        assert why.lower() in error["message"].lower(), error["message"]


def test_a_valid_hs256_token_names_its_subject(make_client: Any) -> None:
    client = make_client(jwt_key=SECRET)
    token = jwt.encode(claims(), SECRET, algorithm="HS256")
    assert client.get("/api/v1/whoami", headers=bearer(token)).get_json() == {
        "name": "ingest-service", "kind": "jwt", "scopes": ["jobs:read", "jobs:write"],
        "authentication": True}
    r = client.post("/api/v1/jobs", json={"type": "echo"}, headers=bearer(token))
    assert r.status_code == 201
    forbidden = client.delete(f"/api/v1/jobs/{r.get_json()['id']}", headers=bearer(token))
    assert forbidden.status_code == 403
    assert forbidden.get_json()["error"]["details"]["scope"] == "jobs:operate"


def test_refused_hs256_tokens(make_client: Any, store: Any) -> None:
    client = make_client(jwt_key=SECRET)
    now = int(time.time())
    cases = {
        "expired": (claims(exp=now - 120), "expired"),
        "not yet valid": (claims(nbf=now + 120), "not yet valid"),
        "wrong audience": (claims(aud="another-api"), "audience"),
        "no audience": (claims(aud=None), "aud"),
        "wrong issuer": (claims(iss="https://evil.example"), "issuer"),
        "no expiry": (claims(exp=None), "exp"),
        "no subject": (claims(sub=None), "sub"),
    }
    for name, (payload, why) in cases.items():
        assert_refused(client, jwt.encode(payload, SECRET, algorithm="HS256"), why), name
    other_key = jwt.encode(claims(), "another-secret-that-is-32-bytes-long!", algorithm="HS256")
    assert_refused(client, other_key, "Signature")
    assert store.list_jobs(status=None, type=None, queue=None, after=None, limit=5) == []


def test_leeway_accepts_small_clock_skew(make_client: Any) -> None:
    client = make_client(jwt_key=SECRET, jwt_leeway_s=30)
    now = int(time.time())
    token = jwt.encode(claims(exp=now - 10, nbf=now + 10), SECRET, algorithm="HS256")
    assert client.get("/api/v1/whoami", headers=bearer(token)).status_code == 200


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def test_a_tampered_token_is_refused(make_client: Any) -> None:
    client = make_client(jwt_key=SECRET)
    header, _payload, signature = jwt.encode(claims(), SECRET, algorithm="HS256").split(".")
    widened = _b64(json.dumps(claims(scope="jobs:write jobs:read jobs:operate")).encode())
    assert_refused(client, f"{header}.{widened}.{signature}", "Signature")


def test_an_unsigned_token_is_refused(make_client: Any) -> None:
    client = make_client(jwt_key=SECRET)
    unsigned = jwt.encode(claims(), None, algorithm="none")
    assert_refused(client, unsigned)
    header = _b64(json.dumps({"alg": "none", "typ": "JWT"}).encode())
    assert_refused(client, f"{header}.{_b64(json.dumps(claims()).encode())}.")


def test_an_rs256_public_key_used_as_an_hs256_secret_is_refused(
        make_client: Any, rsa_key: rsa.RSAPrivateKey) -> None:
    """Algorithm confusion: the attacker signs HS256 with the server's public key as secret."""
    client = make_client(jwt_key=pem(rsa_key), jwt_algorithm="RS256")
    forged = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode()) + "." + _b64(
        json.dumps(claims()).encode())
    signature = hmac.new(pem(rsa_key).encode(), forged.encode(), hashlib.sha256).digest()
    assert_refused(client, f"{forged}.{_b64(signature)}", "alg")
    good = jwt.encode(claims(), rsa_key, algorithm="RS256")
    assert client.get("/api/v1/whoami", headers=bearer(good)).status_code == 200


def test_es256_with_a_pem_key(make_client: Any, ec_key: ec.EllipticCurvePrivateKey,
                              rsa_key: rsa.RSAPrivateKey) -> None:
    client = make_client(jwt_key=pem(ec_key), jwt_algorithm="ES256")
    good = jwt.encode(claims(), ec_key, algorithm="ES256")
    assert client.get("/api/v1/whoami", headers=bearer(good)).status_code == 200
    assert_refused(client, jwt.encode(claims(), rsa_key, algorithm="RS256"), "alg")
    assert_refused(client, jwt.encode(claims(), SECRET, algorithm="HS256"), "alg")


def test_a_token_without_scope_is_forbidden_everywhere(make_client: Any) -> None:
    client = make_client(jwt_key=SECRET)
    token = jwt.encode(claims(scope=None), SECRET, algorithm="HS256")
    for method, path in (("GET", "/api/v1/jobs"), ("GET", "/api/v1/whoami"),
                         ("POST", "/api/v1/jobs"), ("GET", "/api/v1/audit")):
        r = client.open(path, method=method, json={"type": "echo"}, headers=bearer(token))
        assert r.status_code == 403, path
        assert r.get_json()["error"]["code"] == "forbidden"


def test_static_tokens_work_beside_jwts(make_client: Any) -> None:
    client = make_client(jwt_key=SECRET, api_tokens=("ops:static-secret:jobs:operate",))
    assert client.get("/api/v1/whoami", headers=bearer("static-secret")).get_json()["name"] \
        == "ops"
    token = jwt.encode(claims(), SECRET, algorithm="HS256")
    assert client.get("/api/v1/whoami", headers=bearer(token)).get_json()["name"] \
        == "ingest-service"
    assert_refused(client, "not-a-token")


class _Jwks(BaseHTTPRequestHandler):
    document: bytes = b"{}"
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(self.document)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def jwks_server(rsa_key: rsa.RSAPrivateKey) -> Iterator[str]:
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(rsa_key.public_key()))
    _Jwks.document = json.dumps({"keys": [{**jwk, "kid": "k1", "use": "sig"}]}).encode()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Jwks)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/jwks.json"
    server.shutdown()
    server.server_close()


def test_keys_from_a_jwks_url(make_client: Any, jwks_server: str,
                              rsa_key: rsa.RSAPrivateKey) -> None:
    client = make_client(jwt_jwks_url=jwks_server, jwt_algorithm="RS256")
    good = jwt.encode(claims(), rsa_key, algorithm="RS256", headers={"kid": "k1"})
    assert client.get("/api/v1/whoami", headers=bearer(good)).status_code == 200
    unknown_kid = jwt.encode(claims(), rsa_key, algorithm="RS256", headers={"kid": "k9"})
    assert_refused(client, unknown_kid)


def test_an_unreachable_jwks_url_is_a_503(make_client: Any, unused_port: int,
                                          rsa_key: rsa.RSAPrivateKey) -> None:
    client = make_client(jwt_jwks_url=f"http://127.0.0.1:{unused_port}/jwks.json",
                         jwt_algorithm="RS256")
    token = jwt.encode(claims(), rsa_key, algorithm="RS256", headers={"kid": "k1"})
    r = client.get("/api/v1/whoami", headers=bearer(token))
    assert r.status_code == 503 and r.get_json()["error"]["code"] == "jwks_unavailable"
    assert r.headers["Retry-After"] == "5"


def test_keys_that_cannot_work_stop_the_start(settings: Settings,
                                              rsa_key: rsa.RSAPrivateKey,
                                              ec_key: ec.EllipticCurvePrivateKey) -> None:
    for changes in ({"jwt_key": "short"}, {"jwt_key": pem(rsa_key)},
                    {"jwt_key": "x" * 40, "jwt_algorithm": "RS256"},
                    {"jwt_key": SECRET, "jwt_algorithm": "none"},
                    {"jwt_jwks_url": "http://idp/jwks", "jwt_algorithm": "HS256"}):
        with pytest.raises(ConfigError):
            settings.replace(**changes)
    for changes in ({"jwt_key": pem(ec_key), "jwt_algorithm": "RS256"},
                    {"jwt_key": pem(rsa_key), "jwt_algorithm": "ES256"}):
        with pytest.raises(ConfigError):
            create_app(settings.replace(**changes))


def test_time_claims_must_be_numbers_of_a_calendar(make_client: Any, store: Any) -> None:
    """PyJWT compares int(exp): a string or 1e30 (never expiring) would pass it; not here."""
    client = make_client(jwt_key=SECRET)
    now = int(time.time())
    for claim, value in (("exp", str(now + 300)), ("exp", 1e30), ("exp", 253_402_300_800),
                         ("nbf", str(now - 5)), ("nbf", False), ("iat", str(now)),
                         ("iat", -1)):
        assert_refused(client, jwt.encode(claims(**{claim: value}), SECRET, algorithm="HS256"),
                       f"{claim} must be a number"), (claim, value)
    # Refused by PyJWT already (not an integer, or expired at second 1): a 401 all the same.
    for claim, value in (("exp", True), ("nbf", [now]), ("iat", "yesterday")):
        assert_refused(client, jwt.encode(claims(**{claim: value}), SECRET, algorithm="HS256"))
    assert store.list_jobs(status=None, type=None, queue=None, after=None, limit=5) == []
    fraction = jwt.encode(claims(exp=now + 300.5, iat=now - 0.25), SECRET, algorithm="HS256")
    assert client.get("/api/v1/whoami", headers=bearer(fraction)).status_code == 200


def test_a_refusal_quotes_nothing_of_the_token(make_client: Any, jwks_server: str,
                                               rsa_key: rsa.RSAPrivateKey) -> None:
    client = make_client(jwt_jwks_url=jwks_server, jwt_algorithm="RS256")
    marker = "kid-<script>-planted"
    body = _b64(json.dumps(claims()).encode())
    for header in ({"alg": "RS256", "kid": marker}, {"alg": marker, "kid": "k1"}):
        token = f"{_b64(json.dumps(header).encode())}.{body}.{_b64(b'signature')}"
        r = client.post("/api/v1/jobs", json={"type": "echo"}, headers=bearer(token))
        assert r.status_code == 401
        assert marker not in r.get_data(as_text=True) and "planted" not in str(r.headers)
    header = _b64(json.dumps({"alg": "RS256", "kid": "k1"}).encode())
    garbled = f"{header}.{_b64(b'{planted')}.{_b64(b'sig')}"
    r = client.get("/api/v1/whoami", headers=bearer(garbled))
    assert r.status_code == 401 and "planted" not in r.get_data(as_text=True)


def test_audit_records_tell_a_jwt_sub_from_a_static_token_of_its_name(make_client: Any) -> None:
    client = make_client(jwt_key=SECRET, api_tokens=("ops:static-secret",))
    jwt_ops = jwt.encode(claims(sub="ops", scope="jobs:write jobs:read jobs:operate"), SECRET,
                         algorithm="HS256")
    for credential in ("static-secret", jwt_ops):
        job = client.post("/api/v1/jobs", json={"type": "echo"}, headers=bearer(credential))
        assert client.delete(f"/api/v1/jobs/{job.get_json()['id']}",
                             headers=bearer(credential)).status_code == 200
    assert client.post("/api/v1/queues/mail/pause", headers=bearer(jwt_ops)).status_code == 200
    records = client.get("/api/v1/audit", headers=bearer("static-secret")).get_json()["records"]
    assert [(r["actor"], r["action"], r["detail"]["credential"]) for r in records] == [
        ("ops", "queue.pause", "jwt"), ("ops", "job.cancel", "jwt"),
        ("ops", "job.cancel", "token")]
    assert records[1]["detail"] == {"queue": "default", "type": "echo", "credential": "jwt"}
