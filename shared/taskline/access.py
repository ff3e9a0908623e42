"""Who may call the API and how much: scopes, static token entries and enqueue quotas (pure).

Invariant: a configuration that cannot be read exactly as written is refused at start-up with
ConfigError, never guessed at. A token entry is `name:token:scope+scope`, split at its first two
colons (a token holds no colon, a scope does); a bare token (no colon) keeps every scope, so a
configuration written before scopes existed keeps working. A quota is `client=N/unit`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from taskline.errors import ConfigError

WRITE = "jobs:write"
READ = "jobs:read"
OPERATE = "jobs:operate"
SCOPES = frozenset({WRITE, READ, OPERATE})
"""Every scope a route can require; any other scope a JWT carries is ignored."""

CLIENT_NAME = re.compile(r"[A-Za-z0-9_.@-]{1,64}")
_TOKEN = re.compile(r"[^\s:,]{1,512}")
_QUOTA = re.compile(r"([^=\s]+)\s*=\s*([0-9]{1,7})\s*/\s*(s|m|h)")
_WINDOWS = {"s": 1.0, "m": 60.0, "h": 3600.0}
MAX_QUOTA_JOBS = 100_000
"""Largest N of a quota: the window keeps one entry per accepted job in Redis."""


@dataclass(frozen=True)
class StaticToken:
    """One entry of TASKLINE_API_TOKENS: who it names, its secret and what it may do."""

    name: str
    secret: bytes
    scopes: frozenset[str]


@dataclass(frozen=True)
class Quota:
    """At most `jobs` jobs accepted from one client in any `window_s` seconds."""

    jobs: int
    window_s: float

    def __str__(self) -> str:
        unit = {v: k for k, v in _WINDOWS.items()}.get(self.window_s)
        return f"{self.jobs}/{unit}" if unit else f"{self.jobs}/{self.window_s:g}s"


def parse_scopes(text: str, where: str) -> frozenset[str]:
    """`a+b` as a set of known scopes; an unknown or empty one is a ConfigError."""
    scopes = frozenset(part.strip() for part in text.split("+"))
    unknown = scopes - SCOPES
    if unknown or not scopes:
        raise ConfigError(f"{where}: unknown scope {sorted(unknown)!r}; scopes are "
                          + ", ".join(sorted(SCOPES)))
    return scopes


def parse_token(entry: str, position: int) -> StaticToken:
    """One entry: `token`, `name:token` (every scope) or `name:token:scope+scope`.

    A bare token is named `token-<position>` (1-based): its name is what the audit trail and
    quotas see, and a name made from the secret would leak part of it.
    """
    where = f"TASKLINE_API_TOKENS entry {position}"
    parts = entry.split(":", 2)
    if len(parts) == 1:
        name, secret, scopes = f"token-{position}", parts[0], SCOPES
    else:
        name, secret = parts[0], parts[1]
        scopes = parse_scopes(parts[2], where) if len(parts) == 3 else SCOPES
    if not CLIENT_NAME.fullmatch(name):
        raise ConfigError(f"{where}: a name is 1..64 of A-Z a-z 0-9 _ . @ -")
    if not _TOKEN.fullmatch(secret):
        raise ConfigError(f"{where}: a token is 1..512 characters without spaces, ':' or ','")
    return StaticToken(name, secret.encode("utf-8"), scopes)


def parse_tokens(entries: Iterable[str]) -> list[StaticToken]:
    """Every entry parsed; two entries with one name would make the audit trail ambiguous."""
    tokens = [parse_token(entry, i) for i, entry in enumerate(entries, start=1)]
    names = [t.name for t in tokens]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise ConfigError(f"TASKLINE_API_TOKENS names {duplicated!r} more than once")
    return tokens


def parse_quotas(entries: Iterable[str]) -> dict[str, Quota]:
    """`client=N/s` (or /m, /h) entries as {client: Quota}; each client at most once."""
    quotas: dict[str, Quota] = {}
    for entry in entries:
        match = _QUOTA.fullmatch(entry.strip())
        if not match or not CLIENT_NAME.fullmatch(match[1]):
            raise ConfigError(f"TASKLINE_ENQUEUE_QUOTAS entry {entry!r} is not client=N/s "
                              "(or /m, /h) with a client name of A-Z a-z 0-9 _ . @ -")
        jobs = int(match[2])
        if not 1 <= jobs <= MAX_QUOTA_JOBS:
            raise ConfigError(f"TASKLINE_ENQUEUE_QUOTAS entry {entry!r}: N must be "
                              f"1..{MAX_QUOTA_JOBS}")
        if match[1] in quotas:
            raise ConfigError(f"TASKLINE_ENQUEUE_QUOTAS names {match[1]!r} more than once")
        quotas[match[1]] = Quota(jobs, _WINDOWS[match[3]])
    return quotas


def scopes_of_claim(claim: object) -> frozenset[str]:
    """A JWT's `scope` claim (space-separated, RFC 8693 / RFC 9068) as the known scopes in it."""
    if not isinstance(claim, str):
        return frozenset()
    return frozenset(claim.split()) & SCOPES
