"""Browser guards of the API: the Host a request names, and, with authentication off, the site
a state-changing request comes from.

Invariant: a request whose `Host` names no host this API answers to is `400 bad_host` before any
route runs. DNS rebinding points a name of another site at this host, and the browser then sends
that name as `Host`, so refusing unknown names keeps such a page from reading or changing
anything. The names answered to: the host of the `--bind` address, any IP literal, `localhost`,
and TASKLINE_ALLOWED_HOSTS (`*` allows every name). /healthz, /readyz and /metrics answer to any
name, since probes and scrapers reach them by whatever address they have.

With authentication off, a POST, PUT, PATCH or DELETE that a browser sends from another site's
page (an `Origin` other than the request's own host, `Origin: null` included, or
`Sec-Fetch-Site: cross-site`) is `403 forbidden_origin`: any page a developer visits could
otherwise pause a local queue with a form, which needs neither a Content-Type nor a body. A
request carrying neither header (the Python client, curl) is served as before, and the
dashboard's own requests carry its own origin. With authentication on, a browser never sends a
bearer token by itself, so the token already refuses such requests.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

from flask import Flask, request

from taskline.settings import Settings
from taskline_producer.schemas.errors import ApiError

EXEMPT_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_DEFAULT_PORTS = {"http": "80", "https": "443"}
_SHOWN_CHARS = 255


class BadHost(ApiError):
    """The Host header names no host this API answers to (TASKLINE_ALLOWED_HOSTS adds names)."""

    code = "bad_host"


class ForbiddenOrigin(ApiError):
    """A page of another site cannot change anything here while authentication is off."""

    status = 403
    code = "forbidden_origin"


def split_host(value: str) -> tuple[str, str | None]:
    """The lowercase name (IPv6 without brackets, no root dot) and port of a Host value."""
    value = value.strip().lower()
    if value.startswith("["):
        name, _, rest = value[1:].partition("]")
        return name, rest[1:] if rest.startswith(":") else None
    name, colon, port = value.rpartition(":")
    if not colon or ":" in name:  # no port, or an IPv6 literal without brackets
        return value.rstrip("."), None
    return name.rstrip("."), port


def is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def bind_hosts(binds: Iterable[str]) -> frozenset[str]:
    """The host names of gunicorn bind addresses (`HOST:PORT`; unix sockets name none)."""
    return frozenset(split_host(b)[0] for b in binds
                     if b and not b.startswith(("unix:", "fd://")))


class HostPolicy:
    """Which Host names the API answers to."""

    def __init__(self, allowed: Iterable[str]) -> None:
        entries = {split_host(entry)[0] for entry in allowed}
        self.any_host = "*" in entries
        self.names = frozenset(entries | {"localhost"})

    def allows(self, name: str) -> bool:
        return self.any_host or name in self.names or is_ip_literal(name)


def _same_origin(origin: str, host: str) -> bool:
    """Whether `origin` (an Origin header) names the host and port `host` (a Host header) does;
    a port left out is the default of the origin's scheme. The scheme itself is not compared:
    behind a TLS proxy the API sees http where the browser saw https."""
    try:
        parts = urlsplit(origin.strip())
        origin_port = parts.port
    except ValueError:
        return False
    default = _DEFAULT_PORTS.get(parts.scheme.lower())
    if default is None or not parts.hostname:
        return False  # `null`, file:, or no host at all
    name, port = split_host(host)
    origin_name = parts.hostname.rstrip(".").lower()
    return (origin_name, str(origin_port or default)) == (name, port or default)


def check_origin() -> None:
    """Refuse a state-changing request a browser sends from another site's page."""
    if request.method not in STATE_CHANGING:
        return
    if request.headers.get("Sec-Fetch-Site", "").strip().lower() == "cross-site":
        raise ForbiddenOrigin(details={"sec_fetch_site": "cross-site"})
    origin = request.headers.get("Origin")
    if origin is not None and not _same_origin(origin, request.host):
        raise ForbiddenOrigin(details={"origin": origin[:_SHOWN_CHARS]})


def init_app(app: Flask, settings: Settings, binds: Iterable[str] = ()) -> None:
    """Check the Host of every request (the exempt paths aside) and, with authentication
    off, the origin of every state-changing one; registered before authentication."""
    policy = HostPolicy([*settings.allowed_hosts, *bind_hosts(binds)])
    guard_origin = not settings.auth_enabled

    @app.before_request
    def guard() -> None:
        if request.path in EXEMPT_PATHS:
            return
        name = split_host(request.host)[0]
        if not policy.allows(name):
            raise BadHost(details={"host": name[:_SHOWN_CHARS]})
        if guard_origin:
            check_origin()
