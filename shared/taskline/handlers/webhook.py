"""The built-in `webhook` handler: one HTTP POST per attempt, safe against SSRF.

Invariant: a webhook connects only to an address that was vetted for that very request. The
host is resolved once, every resolved address must be public (or permitted by the operator's
allow-list, `TASKLINE_WEBHOOK_ALLOW`), and the connection goes to the vetted address itself
with the original Host header and TLS server name, so a DNS answer that changes between the
check and the connect (DNS rebinding) cannot redirect the request. Redirects are never followed,
proxies from the environment are ignored, and IPv4 addresses hidden inside IPv6 forms
(IPv4-mapped, IPv4-compatible, NAT64, 6to4, Teredo) are judged by the IPv4 address they carry.

Payload: {"url": "https://...", "body": <any JSON>, "headers": {...}, "timeout_s": <= 30,
"method": "POST"}. Outcome: 2xx returns {"status", "body"}; 429, 5xx and network failures
are retried (honouring Retry-After); any other answer, a bad payload or a refused address
dead-letters the job. Every request carries `Idempotency-Key` so receivers can dedupe retries.

The worker calls `configure(settings)` at start so the handler sees the allow-list.
"""

from __future__ import annotations

import email.utils
import http.cookiejar
import ipaddress
import re
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter

from taskline.errors import ConfigError, NonRetryableError, RetryableError
from taskline.handlers.registry import JobContext, handler
from taskline.settings import Settings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

DEFAULT_TIMEOUT_S = 10.0
MAX_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 5.0
MAX_URL_CHARS = 2048
MAX_RESPONSE_BYTES = 64 * 1024
RESULT_BODY_CHARS = 4096
RETRY_AFTER_MAX_S = 3600.0
USER_AGENT = "taskline-webhook/1"
PAYLOAD_FIELDS = frozenset({"url", "body", "headers", "timeout_s", "method"})
# Headers taskline sets itself: a caller-chosen Host would detach the request from the vetted
# address's name, and framing headers are computed from the body.
RESERVED_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection",
                              "idempotency-key"})
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}$")
_HEADER_VALUE_FORBIDDEN = re.compile(r"[\r\n\x00]")

# Every IPv4 range that is not publicly routable unicast (IANA special-purpose registry).
_BLOCKED_V4 = tuple(ipaddress.IPv4Network(n) for n in (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
    "172.16.0.0/12", "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16",
    "198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
))
# Public IPv6 unicast lives in 2000::/3, so loopback, unspecified, ULA (fc00::/7), link-local,
# multicast and the NAT64 local-use prefix 64:ff9b:1::/48 all fall outside it (the last is
# refused whole: where its IPv4 address sits depends on a prefix length only its operator
# knows). Inside 2000::/3 these are special-purpose. Forms that embed an IPv4 address are
# decoded before either rule applies.
_GLOBAL_UNICAST_V6 = ipaddress.IPv6Network("2000::/3")
_BLOCKED_V6 = tuple(ipaddress.IPv6Network(n) for n in (
    "2001::/23", "2001:db8::/32", "3fff::/20",
))
_MAPPED_V6 = ipaddress.IPv6Network("::ffff:0:0/96")
_TRANSLATED_V6 = ipaddress.IPv6Network("::ffff:0:0:0/96")
_COMPATIBLE_V6 = ipaddress.IPv6Network("::/96")
_NAT64_V6 = ipaddress.IPv6Network("64:ff9b::/96")
_SIXTOFOUR_V6 = ipaddress.IPv6Network("2002::/16")
_TEREDO_V6 = ipaddress.IPv6Network("2001::/32")


class AddressRefused(NonRetryableError):
    """The webhook target resolves to an address that is not allowed."""


def embedded_ipv4(ip: ipaddress.IPv6Address) -> tuple[ipaddress.IPv4Address, ...]:
    """The IPv4 addresses an IPv6 transition form carries (empty for a plain IPv6 address)."""
    low32 = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip in _MAPPED_V6 or ip in _TRANSLATED_V6 or ip in _NAT64_V6:
        return (low32,)
    if ip in _COMPATIBLE_V6:
        return (low32,)  # also covers :: and ::1, whose low bits are 0.0.0.0 and 0.0.0.1
    if ip in _SIXTOFOUR_V6:
        return (ip.sixtofour,) if ip.sixtofour else ()
    if ip in _TEREDO_V6 and ip.teredo:
        server, client = ip.teredo  # the client address is de-obfuscated by ipaddress
        return (server, client)
    return ()


def is_public(ip: IPAddress) -> bool:
    """True when `ip` is publicly routable unicast, judging hidden IPv4 addresses too."""
    if isinstance(ip, ipaddress.IPv4Address):
        return not any(ip in net for net in _BLOCKED_V4)
    if ip in _COMPATIBLE_V6:
        return False  # deprecated (RFC 4291) and unroutable, whatever IPv4 address it carries
    carried = embedded_ipv4(ip)
    if carried:
        return all(is_public(v4) for v4 in carried)
    return ip in _GLOBAL_UNICAST_V6 and not any(ip in net for net in _BLOCKED_V6)


@dataclass(frozen=True)
class AddressPolicy:
    """Which targets a webhook may reach: public addresses, plus the operator's allow-list."""

    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    hostnames: tuple[str, ...] = ()

    @classmethod
    def from_entries(cls, entries: tuple[str, ...] | list[str]) -> AddressPolicy:
        """Parse allow-list entries: a CIDR or address, a host name, or `.suffix` for subdomains."""
        networks, hostnames = [], []
        for entry in (e.strip() for e in entries):
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                name = entry.lower().rstrip(".")
                if not re.fullmatch(r"\.?[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?", name):
                    raise ConfigError(f"TASKLINE_WEBHOOK_ALLOW: {entry!r} is neither a CIDR "
                                      "nor a host name") from None
                hostnames.append(name)
        return cls(tuple(networks), tuple(hostnames))

    def allows_host(self, hostname: str) -> bool:
        name = hostname.lower().rstrip(".")
        return any(name == h or (h.startswith(".") and name.endswith(h)) for h in self.hostnames)

    def allows(self, hostname: str, ip: IPAddress) -> bool:
        if self.allows_host(hostname) or any(ip in net for net in self.networks):
            return True
        return is_public(ip)


_policy = AddressPolicy()


def configure(settings: Settings) -> None:
    """Load the allow-list from settings; the worker calls this once after loading handlers."""
    global _policy
    _policy = AddressPolicy.from_entries(settings.webhook_allow)


def current_policy() -> AddressPolicy:
    return _policy


def vet(hostname: str, port: int, policy: AddressPolicy) -> str:
    """Resolve `hostname` and return the address to connect to; AddressRefused unless every
    resolved address is allowed (one bad answer among good ones is how rebinding attacks hide)."""
    try:
        infos = socket.getaddrinfo(hostname, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        if err.errno == socket.EAI_AGAIN:
            raise RetryableError(f"cannot resolve {hostname!r} now: {err}") from None
        raise NonRetryableError(f"cannot resolve {hostname!r}: {err}") from None
    addresses = [str(info[4][0]) for info in infos]
    for address in addresses:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        if not policy.allows(hostname, ip):
            raise AddressRefused(f"webhook target {hostname!r} resolves to {ip}, which is not "
                                 "a public address (allow it with TASKLINE_WEBHOOK_ALLOW)")
    if not addresses:
        raise NonRetryableError(f"{hostname!r} resolves to no address")
    return addresses[0]


class PinnedAdapter(HTTPAdapter):
    """Connects to the vetted address of each request's host, keeping Host and the TLS name.

    The pool key includes the address, so a pooled connection is only ever reused for the
    address it was opened to.
    """

    def __init__(self, policy: Callable[[], AddressPolicy] = current_policy,
                 **kwargs: Any) -> None:
        self._policy = policy
        super().__init__(**kwargs)

    def build_connection_pool_key_attributes(self, request, verify, cert=None):  # type: ignore[no-untyped-def]
        host_params, pool_kwargs = super().build_connection_pool_key_attributes(
            request, verify, cert)
        hostname = host_params["host"]
        port = host_params["port"] or (443 if host_params["scheme"] == "https" else 80)
        host_params["host"] = vet(hostname, port, self._policy())
        if host_params["scheme"] == "https":
            pool_kwargs["server_hostname"] = hostname
        return host_params, pool_kwargs

    def add_headers(self, request, **kwargs):  # type: ignore[no-untyped-def]
        # The connection is opened to an IP address; the receiver still sees the name.
        request.headers["Host"] = urlsplit(request.url).netloc.rpartition("@")[2]


class _NoRedirectSession(requests.Session):
    """A session that never follows a redirect and never reads a redirect's body.

    With allow_redirects=False, requests still reads a 3xx body whole (unbounded) to prepare
    `Response.next`; resolving no redirects at all closes both holes.
    """

    def resolve_redirects(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        return iter(())


def _new_session() -> requests.Session:
    session = _NoRedirectSession()
    session.trust_env = False  # an environment proxy would bypass the vetting and the pin
    # Cookies set by one receiver must never ride along to another job's request.
    session.cookies.set_policy(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
    adapter = PinnedAdapter()
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


_session = _new_session()


@dataclass(frozen=True)
class WebhookRequest:
    """A validated webhook payload."""

    url: str
    body: Any = None
    has_body: bool = False
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = DEFAULT_TIMEOUT_S

    @classmethod
    def from_payload(cls, payload: Any) -> WebhookRequest:
        if not isinstance(payload, dict):
            raise NonRetryableError("webhook payload must be an object with a `url`")
        unknown = sorted(set(payload) - PAYLOAD_FIELDS)
        if unknown:
            raise NonRetryableError(f"webhook payload has unknown fields: {', '.join(unknown)}")
        method = payload.get("method", "POST")
        if not isinstance(method, str) or method.upper() != "POST":
            raise NonRetryableError("webhook `method` must be POST")
        return cls(url=_check_url(payload.get("url")), body=payload.get("body"),
                   has_body="body" in payload, headers=_check_headers(payload.get("headers")),
                   timeout_s=_check_timeout(payload.get("timeout_s", DEFAULT_TIMEOUT_S)))


def _check_url(url: Any) -> str:
    if not isinstance(url, str) or not url or len(url) > MAX_URL_CHARS:
        raise NonRetryableError(f"webhook `url` must be a string of 1..{MAX_URL_CHARS} chars")
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError on a malformed port
    except ValueError as err:
        raise NonRetryableError(f"webhook `url` is malformed: {err}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise NonRetryableError("webhook `url` must be an absolute http:// or https:// URL")
    if "@" in parts.netloc:
        raise NonRetryableError("webhook `url` must not carry credentials; use `headers`")
    if any(c.isspace() or ord(c) < 32 for c in url):
        raise NonRetryableError("webhook `url` must not contain whitespace or control chars")
    return url


def _check_headers(headers: Any) -> dict[str, str]:
    if headers is None:
        return {}
    if not isinstance(headers, dict):
        raise NonRetryableError("webhook `headers` must be an object of strings")
    for name, value in headers.items():
        if not _HEADER_NAME.match(name) or not isinstance(value, str):
            raise NonRetryableError(f"webhook header {name!r} must be a token with a string value")
        if _HEADER_VALUE_FORBIDDEN.search(value):
            raise NonRetryableError(f"webhook header {name!r} contains CR, LF or NUL")
        if name.lower() in RESERVED_HEADERS:
            raise NonRetryableError(f"webhook header {name!r} is set by taskline")
    return dict(headers)


def _check_timeout(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise NonRetryableError("webhook `timeout_s` must be a number")
    if not 0 < value <= MAX_TIMEOUT_S:
        raise NonRetryableError(f"webhook `timeout_s` must be > 0 and <= {MAX_TIMEOUT_S:g}")
    return float(value)


@handler("webhook")
def webhook(payload: Any, ctx: JobContext) -> dict[str, Any]:
    """POST `body` as JSON to `url`; see the module docstring for the outcome rules."""
    request = WebhookRequest.from_payload(payload)
    headers = {"User-Agent": USER_AGENT, **request.headers,
               "Idempotency-Key": ctx.idempotency_key,
               "X-Taskline-Job-Id": str(ctx.job_id), "X-Taskline-Attempt": str(ctx.attempt)}
    kwargs: dict[str, Any] = {"json": request.body} if request.has_body else {}
    try:
        response = _session.post(request.url, headers=headers, allow_redirects=False,
                                 stream=True, timeout=(min(CONNECT_TIMEOUT_S, request.timeout_s),
                                                       request.timeout_s), **kwargs)
        with response:
            text = _read_text(response, time.monotonic() + request.timeout_s)
    except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError,
            requests.exceptions.ContentDecodingError) as err:
        raise RetryableError(f"webhook request to {_where(request.url)} failed: {err}") from None
    except requests.RequestException as err:
        raise NonRetryableError(f"webhook request to {_where(request.url)} is invalid: {err}") \
            from None
    return outcome(response.status_code, response.headers, text)


def _read_text(response: requests.Response, deadline: float) -> str:
    """At most MAX_RESPONSE_BYTES of the body, read until `deadline`, as text for the result."""
    chunks, size = [], 0
    for chunk in response.iter_content(8192):
        chunks.append(chunk)
        size += len(chunk)
        if size >= MAX_RESPONSE_BYTES or time.monotonic() > deadline:
            break
    raw = b"".join(chunks)[:MAX_RESPONSE_BYTES]
    text = raw.decode(response.encoding or "utf-8", errors="replace")
    # jsonb rejects NUL characters, and the result is stored as jsonb.
    return text.replace("\x00", "")[:RESULT_BODY_CHARS]


def outcome(status: int, headers: Any, text: str) -> dict[str, Any]:
    """Map an HTTP answer to the job's result or to the error that decides its retry."""
    if 200 <= status < 300:
        return {"status": status, "body": text}
    summary = f"webhook answered {status}: {text[:200]}"
    if status == 429 or status >= 500:
        raise RetryableError(summary, delay_s=retry_after_s(headers.get("Retry-After")))
    if 300 <= status < 400:
        raise NonRetryableError(f"webhook answered {status} redirect to "
                                f"{headers.get('Location')!r}; redirects are not followed")
    raise NonRetryableError(summary)


def retry_after_s(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or HTTP-date), capped; None if absent."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return min(float(value), RETRY_AFTER_MAX_S)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    delta = (when - (now or datetime.now(UTC))).total_seconds()
    return min(max(delta, 0.0), RETRY_AFTER_MAX_S)


def _where(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"
