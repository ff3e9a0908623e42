"""Typed settings, read from the environment once per process and passed down.

Library code never reads the environment itself: each service's entry point calls
`Settings.from_env()` and hands the object to what it builds, so tests and forks can override
any field. Every duration accepts fractions (0.2) so tests can shorten it; every default is safe
for production. Cross-field rules are checked in `validate()` and fail at start-up.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields

from taskline.errors import ConfigError

ENV_PREFIX = "TASKLINE_"


@dataclass(frozen=True)
class Settings:
    """One process's configuration; field docs give unit, default and bounds."""

    database_url: str = "postgresql://localhost/taskline"
    """PostgreSQL DSN (env DATABASE_URL)."""
    redis_url: str = "redis://localhost:6379/0"
    """Redis URL (env REDIS_URL)."""
    handlers: tuple[str, ...] = ()
    """Modules imported for their @handler registrations (comma-separated)."""
    lease_s: float = 15.0
    """Seconds one attempt's lease lasts before the reaper may recover it; > 0."""
    heartbeat_s: float = 5.0
    """Worker heartbeat period, seconds; the heartbeat key lives three periods; < lease_s."""
    reaper_interval_s: float = 5.0
    """Seconds between reaper (and promoter) passes; > 0."""
    reconcile_interval_s: float = 30.0
    """Seconds between reconciliation passes; > 0."""
    backoff_base_s: float = 10.0
    """First retry delay, seconds; >= 0."""
    backoff_factor: float = 4.0
    """Growth of the retry delay per attempt; >= 1."""
    backoff_max_s: float = 3600.0
    """Cap of the retry delay, seconds; >= backoff_base_s."""
    max_payload_bytes: int = 1_048_576
    """Largest accepted request body, bytes; larger bodies get 413."""
    api_tokens: tuple[str, ...] = ()
    """Bearer tokens the API accepts; empty means no authentication."""
    shutdown_grace_s: float = 30.0
    """Seconds a stopping worker lets running jobs finish before handing them back."""
    metrics_port: int = 9100
    """Port of /metrics for worker and maintenance; 0 turns it off."""
    default_timeout_s: float = 300.0
    """Handler timeout of a job that names none, seconds; > 0."""
    default_max_retries: int = 3
    """Retries of a job that names none; 0..100."""
    log_format: str = "json"
    """`json` (one event per line) or `text` (for make run)."""
    log_level: str = "INFO"
    """Python logging level name."""
    webhook_allow: tuple[str, ...] = ()
    """CIDRs or host names the webhook handler may reach although private or loopback."""
    claim_batch: int = 0
    """Ids a worker claims per PostgreSQL round trip; 0 means its concurrency."""
    retain_succeeded_s: float = 604_800.0
    """Seconds a succeeded job, its events and leases are kept after it finished (7 days);
    >= 0, 0 keeps them forever."""
    retain_cancelled_s: float = 604_800.0
    """The same for cancelled jobs (7 days); >= 0, 0 keeps forever."""
    retain_dead_s: float = 2_592_000.0
    """The same for dead jobs, with their dead_letter_jobs row and DLQ entry (30 days); >= 0,
    0 keeps forever."""
    otlp_endpoint: str = ""
    """OTLP/HTTP base URL traces are exported to (env OTEL_EXPORTER_OTLP_ENDPOINT, e.g.
    http://collector:4318; spans go to its /v1/traces); empty turns tracing off."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        """Build settings from `env` (default os.environ), then apply `overrides`, then validate."""
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        for f in fields(cls):
            raw = env.get(_env_name(f.name))
            if raw is not None and raw != "":
                values[f.name] = _parse(f, raw)
        values.update(overrides)
        settings = cls(**values)  # type: ignore[arg-type]
        settings.validate()
        return settings

    def replace(self, **changes: object) -> Settings:
        """A validated copy with `changes` applied."""
        settings = dataclasses.replace(self, **changes)  # type: ignore[arg-type]
        settings.validate()
        return settings

    def validate(self) -> None:
        """Fail with ConfigError on any value or combination that cannot work."""
        problems = [msg for ok, msg in self._rules() if not ok]
        if problems:
            raise ConfigError("invalid settings: " + "; ".join(problems))

    def _rules(self) -> list[tuple[bool, str]]:
        return [
            (self.lease_s > 0, "TASKLINE_LEASE_S must be > 0"),
            (0 < self.heartbeat_s < self.lease_s,
             "TASKLINE_HEARTBEAT_S must be > 0 and shorter than TASKLINE_LEASE_S"),
            (self.reaper_interval_s > 0, "TASKLINE_REAPER_INTERVAL_S must be > 0"),
            (self.reconcile_interval_s > 0, "TASKLINE_RECONCILE_INTERVAL_S must be > 0"),
            (self.backoff_base_s >= 0, "TASKLINE_BACKOFF_BASE_S must be >= 0"),
            (self.backoff_factor >= 1, "TASKLINE_BACKOFF_FACTOR must be >= 1"),
            (self.backoff_max_s >= self.backoff_base_s,
             "TASKLINE_BACKOFF_MAX_S must be >= TASKLINE_BACKOFF_BASE_S"),
            (self.max_payload_bytes >= 1024, "TASKLINE_MAX_PAYLOAD_BYTES must be >= 1024"),
            (self.shutdown_grace_s >= 0, "TASKLINE_SHUTDOWN_GRACE_S must be >= 0"),
            (0 <= self.metrics_port <= 65535, "TASKLINE_METRICS_PORT must be 0..65535"),
            (self.default_timeout_s > 0, "TASKLINE_DEFAULT_TIMEOUT_S must be > 0"),
            (0 <= self.default_max_retries <= 100, "TASKLINE_DEFAULT_MAX_RETRIES must be 0..100"),
            (self.log_format in ("json", "text"), "TASKLINE_LOG_FORMAT must be json or text"),
            (0 <= self.claim_batch <= 1000, "TASKLINE_CLAIM_BATCH must be 0..1000"),
            *((value >= 0, f"{_env_name(name)} must be >= 0 (0 keeps forever)")
              for name, value in (("retain_succeeded_s", self.retain_succeeded_s),
                                  ("retain_cancelled_s", self.retain_cancelled_s),
                                  ("retain_dead_s", self.retain_dead_s))),
        ]

    @property
    def renew_every_s(self) -> float:
        """How often a running attempt renews its lease: a third of the lease."""
        return self.lease_s / 3

    @property
    def retention_s(self) -> dict[str, float]:
        """Seconds each finished status is kept, by status name; 0 keeps forever."""
        return {"succeeded": self.retain_succeeded_s, "cancelled": self.retain_cancelled_s,
                "dead": self.retain_dead_s}

    @property
    def retention_interval_s(self) -> float:
        """Seconds between retention passes: 10 reaper intervals (50 s by default)."""
        return 10 * self.reaper_interval_s

    @property
    def fence_margin_s(self) -> float:
        """How long before its lease could expire a worker stops an attempt it cannot renew,
        measured from the last renewal's send: a tenth of the lease. Small, so that a process
        paused for half a lease resumes, renews and keeps the attempt PostgreSQL still grants."""
        return self.lease_s / 10


_UNPREFIXED = {"database_url": "DATABASE_URL", "redis_url": "REDIS_URL",
               "otlp_endpoint": "OTEL_EXPORTER_OTLP_ENDPOINT"}


def _env_name(field_name: str) -> str:
    return _UNPREFIXED.get(field_name, ENV_PREFIX + field_name.upper())


def env_names() -> list[str]:
    """Every environment variable Settings reads, for docs and the config-drift test."""
    return [_env_name(f.name) for f in fields(Settings)]


def _parse(f: dataclasses.Field, raw: str) -> object:
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    try:
        if kind.startswith("tuple"):
            return tuple(part.strip() for part in raw.split(",") if part.strip())
        if kind == "float":
            return float(raw)
        if kind == "int":
            return int(raw)
        return raw
    except ValueError:
        raise ConfigError(f"{_env_name(f.name)}={raw!r} is not a valid {kind}") from None


__all__ = ["Settings", "env_names"]
