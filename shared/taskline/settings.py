"""Typed settings, read from the environment once per process and passed down.

Library code never reads the environment itself: each service's entry point calls
`Settings.from_env()` and hands the object to what it builds, so tests and forks can override
any field. Every duration accepts fractions (0.2) so tests can shorten it; every default is safe
for production. Cross-field rules are checked in `validate()` and fail at start-up.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields

from taskline import affinity, sched_policy
from taskline.access import parse_quotas, parse_tokens
from taskline.errors import ConfigError

ENV_PREFIX = "TASKLINE_"
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
JWT_ALGORITHMS = ("HS256", "RS256", "ES256")
POOLING_MODES = ("session", "transaction")
# A DNS name as Host headers carry it: labels of letters, digits, `-` and `_` (container and
# service names use it), at most 253 characters, an optional root dot.
_HOST_NAME = re.compile(r"(?=.{1,254}$)([A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?\.)*"
                        r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?\.?")


@dataclass(frozen=True)
class Settings:
    """One process's configuration; field docs give unit, default and bounds."""

    database_url: str = "postgresql://localhost/taskline"
    """PostgreSQL DSN (env DATABASE_URL)."""
    redis_url: str = "redis://localhost:6379/0"
    """Redis URL (env REDIS_URL)."""
    queue_partitions: int = 1
    """Redis partitions of every queue, 1..64 (1: one set of keys per queue, `taskline:{q}:`).
    With N > 1 a job's id picks one of N hash tags (`{q}`, `{q#1}` .. `{q#N-1}`), so one
    queue's lists spread over N cluster slots; strict priority holds within a partition only.
    Producers, workers and maintenance should agree; during a rolling change workers serve the
    partitions they find and reconciliation moves ids out of partitions at or above N."""
    database_pooling: str = "session"
    """What stands at DATABASE_URL: `session` (PostgreSQL itself, or a pooler that gives each
    client a session of its own) or `transaction` (a transaction-pooling PgBouncer: nothing is
    prepared on its connections and no session state is kept between transactions)."""
    database_direct_url: str = ""
    """A DSN of PostgreSQL itself (or of a session pool) for what needs a session of its own:
    LISTEN and `taskline migrate`'s lock; empty means DATABASE_URL. Only read when
    TASKLINE_DATABASE_POOLING is `transaction`; without it LISTEN-based wake-ups poll instead
    (at most 1 s apart) and `taskline migrate` refuses to run."""
    schema: str = "taskline"
    """The PostgreSQL schema holding every table, view and function of taskline and its own
    migration version table; a lowercase identifier (letters, digits, `_`), at most 63 bytes,
    not starting with `pg_`.
    Every statement names it, so a connection's `search_path` need not include it."""
    handlers: tuple[str, ...] = ()
    """Modules imported for their @handler registrations (comma-separated)."""
    type_ttl_s: float = 86_400.0
    """Seconds a worker's declared job types (and payload schemas) count after it was last
    seen; the API accepts a payload that fits any of them; > 0 (1 day)."""
    unknown_types: str = "accept"
    """What the API does with a job type no worker seen within TASKLINE_TYPE_TTL_S declared:
    `accept` (default) or `reject` (422)."""
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
    max_queues: int = 1000
    """Most distinct queues holding unfinished jobs; a job for one more queue is refused
    (`queue_limit`); >= 1."""
    max_schedules: int = 1000
    """Most schedules; creating one more is refused (422 `schedule_limit`); >= 1."""
    prune_schedules: bool = False
    """Whether maintenance, at start, deletes the schedules declared in code (`@periodic`) that
    the code no longer declares (without it they are only reported)."""
    min_schedule_period_s: float = 1.0
    """Shortest time between two slots of a schedule, seconds; a cron expression firing more
    often is refused (422); >= 1 (slots are whole seconds)."""
    api_list_threads: int = 2
    """Threads of each API process that serve list and page reads (GET of the job, workflow,
    DLQ, audit, queue and schedule lists, and a workflow's steps), beside its request threads;
    more such reads wait for one without holding a thread, so a storm of them never leaves
    enqueues waiting for a thread; 1 <= value <= 1024."""
    api_list_nice: int = 10
    """How much lower the OS priority (Linux nice) of each API process's list threads is than
    its request threads', so the kernel runs an enqueue's thread first when both want a core;
    0 <= value <= 19."""
    api_list_rate: float = 50.0
    """List and page reads each API process starts per second at most (0: no pace); more
    wait, holding no thread, and are answered in turn; 0 <= value <= 100000."""
    api_list_cache_s: float = 1.0
    """Seconds an API process answers GET /api/v1/workflows from what the same query by the
    same principal was answered (its step counts, and workflows another API process created,
    may be that old; a byte-identical repeat is answered by the event loop); 0 turns it off;
    0 <= value <= 60."""
    http_header_timeout_s: float = 10.0
    """Seconds the API waits for a request's line and headers (from the connection's opening,
    or from a kept-alive request's first byte); a connection that misses it gets 408 and is
    closed; 0 < value <= 3600."""
    http_body_timeout_s: float = 30.0
    """Seconds the API waits for a request's whole body after its headers (and at most for one
    write of its answer to a client that stops reading); missed: 408 and closed;
    0 < value <= 3600."""
    api_tokens: tuple[str, ...] = ()
    """Bearer tokens the API accepts (`token`, or `name:token:scope+scope`, comma-separated);
    empty, with no JWT key either, means no authentication (taskline.access)."""
    allowed_hosts: tuple[str, ...] = ()
    """Host names the API answers to beside the host of its --bind address, any IP literal and
    `localhost` (comma-separated names without port; `*` allows every name); a request naming
    another Host gets 400, /healthz, /readyz and /metrics aside."""
    shutdown_grace_s: float = 30.0
    """Seconds a stopping worker lets running jobs finish before handing them back."""
    metrics_port: int = 9100
    """Port of /metrics for worker and maintenance; 0 turns it off."""
    default_timeout_s: float = 300.0
    """Handler timeout of a job that names none, seconds; > 0."""
    default_max_retries: int = 3
    """Retries of a job that names none; 0..100."""
    max_snoozes: int = 100
    """Snoozes (`raise taskline.Snooze`) a job may take; the next one makes it dead. 0..10^6."""
    log_format: str = "json"
    """`json` (one event per line) or `text` (for make run)."""
    log_level: str = "INFO"
    """Python logging level name."""
    webhook_allow: tuple[str, ...] = ()
    """CIDRs or host names the webhook handler may reach although private or loopback."""
    claim_batch: int = 0
    """Ids a worker claims per PostgreSQL round trip; 0 means its concurrency."""
    worker_cpus: str = affinity.AUTO
    """CPUs a worker process is pinned to (taskline.affinity): `auto` (default) gives each
    worker process of the host one CPU of its own while CPUs last, pinned to it while busy and
    free while idle or saturated, moved off it when crowded (taskline.placement);
    `none` (or empty) leaves it to the kernel; a list (`3`, `0,2`, `0-3`) pins it to those."""
    worker_sched: str = sched_policy.BATCH
    """The kernel's scheduling policy of a worker process (taskline.sched_policy): `batch`
    (default: a thread it wakes does not preempt the thread that woke it) or `normal`."""
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
    jwt_key: str = ""
    """Key JWTs are verified with: the HS256 secret (its raw UTF-8 bytes, >= 32 of them) or
    the PEM public key for RS256/ES256; empty (and no JWKS URL) means no JWT is accepted."""
    jwt_algorithm: str = "HS256"
    """The one algorithm a JWT may be signed with: HS256, RS256 or ES256; never the header's."""
    jwt_jwks_url: str = ""
    """URL of a JWK Set the RS256/ES256 keys are fetched from (instead of TASKLINE_JWT_KEY)."""
    jwt_audience: str = ""
    """When set, a JWT's `aud` must name it; when empty, a JWT carrying `aud` is refused."""
    jwt_issuer: str = ""
    """When set, a JWT's `iss` must equal it."""
    jwt_leeway_s: float = 30.0
    """Clock skew allowed when checking `exp` and `nbf`, seconds; 0..300."""
    enqueue_quotas: tuple[str, ...] = ()
    """Per-client enqueue quotas, `client=N/s` (or /m, /h) by token name or JWT `sub`."""
    history_partitions_ahead: int = 7
    """Partitions of `job_events` and `job_leases` maintenance keeps ready past the one being
    written (taskline.store.partitions); 1..60, about a day each."""
    history_partition_s: float = 86_400.0
    """Seconds of history a partition holds before maintenance moves the tables' sequences to
    the next one (a day); > 0."""
    retain_audit_s: int = 31_536_000
    """Whole seconds audit records are kept (365 days); 0 keeps them forever."""
    audit_interval_s: float = 0.0
    """Seconds between maintenance's audits of the last day of recorded history (the rules of
    `taskline audit verify`, metric taskline_audit_violations); 0 (default): never."""

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
            (valid_schema(self.schema),
             "TASKLINE_SCHEMA must be a lowercase identifier: a letter or _, then letters, "
             "digits or _, at most 63 bytes, not starting with pg_ (PostgreSQL's own)"),
            (self.database_pooling in POOLING_MODES,
             "TASKLINE_DATABASE_POOLING must be session or transaction"),
            (1 <= self.queue_partitions <= 64, "TASKLINE_QUEUE_PARTITIONS must be 1..64"),
            (self.lease_s > 0, "TASKLINE_LEASE_S must be > 0"),
            (self.type_ttl_s > 0, "TASKLINE_TYPE_TTL_S must be > 0"),
            (self.unknown_types in ("accept", "reject"),
             "TASKLINE_UNKNOWN_TYPES must be accept or reject"),
            (0 < self.heartbeat_s < self.lease_s,
             "TASKLINE_HEARTBEAT_S must be > 0 and shorter than TASKLINE_LEASE_S"),
            (self.reaper_interval_s > 0, "TASKLINE_REAPER_INTERVAL_S must be > 0"),
            (self.reconcile_interval_s > 0, "TASKLINE_RECONCILE_INTERVAL_S must be > 0"),
            (self.backoff_base_s >= 0, "TASKLINE_BACKOFF_BASE_S must be >= 0"),
            (self.backoff_factor >= 1, "TASKLINE_BACKOFF_FACTOR must be >= 1"),
            (self.backoff_max_s >= self.backoff_base_s,
             "TASKLINE_BACKOFF_MAX_S must be >= TASKLINE_BACKOFF_BASE_S"),
            (self.max_payload_bytes >= 1024, "TASKLINE_MAX_PAYLOAD_BYTES must be >= 1024"),
            (self.max_queues >= 1, "TASKLINE_MAX_QUEUES must be >= 1"),
            (self.max_schedules >= 1, "TASKLINE_MAX_SCHEDULES must be >= 1"),
            (self.min_schedule_period_s >= 1, "TASKLINE_MIN_SCHEDULE_PERIOD_S must be >= 1"),
            (1 <= self.api_list_threads <= 1024, "TASKLINE_API_LIST_THREADS must be 1..1024"),
            (0 <= self.api_list_nice <= 19, "TASKLINE_API_LIST_NICE must be 0..19"),
            (0 <= self.api_list_rate <= 100_000, "TASKLINE_API_LIST_RATE must be 0..100000"),
            (0 <= self.api_list_cache_s <= 60, "TASKLINE_API_LIST_CACHE_S must be 0..60"),
            (0 < self.http_header_timeout_s <= 3600,
             "TASKLINE_HTTP_HEADER_TIMEOUT_S must be > 0 and <= 3600"),
            (0 < self.http_body_timeout_s <= 3600,
             "TASKLINE_HTTP_BODY_TIMEOUT_S must be > 0 and <= 3600"),
            (self.shutdown_grace_s >= 0, "TASKLINE_SHUTDOWN_GRACE_S must be >= 0"),
            (0 <= self.metrics_port <= 65535, "TASKLINE_METRICS_PORT must be 0..65535"),
            (self.default_timeout_s > 0, "TASKLINE_DEFAULT_TIMEOUT_S must be > 0"),
            (0 <= self.default_max_retries <= 100, "TASKLINE_DEFAULT_MAX_RETRIES must be 0..100"),
            (0 <= self.max_snoozes <= 1_000_000, "TASKLINE_MAX_SNOOZES must be 0..1000000"),
            (self.log_format in ("json", "text"), "TASKLINE_LOG_FORMAT must be json or text"),
            (0 <= self.claim_batch <= 1000, "TASKLINE_CLAIM_BATCH must be 0..1000"),
            (affinity.valid(self.worker_cpus),
             "TASKLINE_WORKER_CPUS must be auto, none or a CPU list such as 0,2-3"),
            (self.worker_sched in sched_policy.POLICIES,
             "TASKLINE_WORKER_SCHED must be batch or normal"),
            (0 <= self.jwt_leeway_s <= 300, "TASKLINE_JWT_LEEWAY_S must be 0..300"),
            (self.retain_audit_s >= 0, "TASKLINE_RETAIN_AUDIT_S must be >= 0"),
            (1 <= self.history_partitions_ahead <= 60,
             "TASKLINE_HISTORY_PARTITIONS_AHEAD must be 1..60"),
            (self.history_partition_s > 0, "TASKLINE_HISTORY_PARTITION_S must be > 0"),
            (self.audit_interval_s >= 0, "TASKLINE_AUDIT_INTERVAL_S must be >= 0 (0 = off)"),
            (all(map(allowed_host_entry, self.allowed_hosts)),
             "TASKLINE_ALLOWED_HOSTS holds host names (no scheme, port or path), IP literals "
             "or *, comma-separated"),
            *self._jwt_rules(),
            *self._access_rules(),
            *((value >= 0, f"{_env_name(name)} must be >= 0 (0 keeps forever)")
              for name, value in (("retain_succeeded_s", self.retain_succeeded_s),
                                  ("retain_cancelled_s", self.retain_cancelled_s),
                                  ("retain_dead_s", self.retain_dead_s))),
        ]

    @property
    def jwt_enabled(self) -> bool:
        return bool(self.jwt_key or self.jwt_jwks_url)

    @property
    def auth_enabled(self) -> bool:
        """Authentication is on when any token or a JWT key is configured."""
        return bool(self.api_tokens) or self.jwt_enabled

    def _jwt_rules(self) -> list[tuple[bool, str]]:
        hmac = self.jwt_algorithm == "HS256"
        pem = self.jwt_key.lstrip().startswith("-----BEGIN")
        return [
            (self.jwt_algorithm in JWT_ALGORITHMS,
             "TASKLINE_JWT_ALGORITHM must be one of " + ", ".join(JWT_ALGORITHMS)),
            (not (self.jwt_key and self.jwt_jwks_url),
             "set TASKLINE_JWT_KEY or TASKLINE_JWT_JWKS_URL, not both"),
            (not (self.jwt_jwks_url and hmac),
             "TASKLINE_JWT_JWKS_URL needs TASKLINE_JWT_ALGORITHM RS256 or ES256"),
            # A public key used as an HMAC secret is the algorithm-confusion attack's key.
            (not (hmac and self.jwt_key) or (len(self.jwt_key.encode()) >= 32 and not pem),
             "an HS256 TASKLINE_JWT_KEY is a secret of at least 32 bytes, not a PEM key"),
            (not self.jwt_key or hmac or pem,
             "an RS256/ES256 TASKLINE_JWT_KEY is a PEM public key (-----BEGIN PUBLIC KEY-----)"),
        ]

    def _access_rules(self) -> list[tuple[bool, str]]:
        """Token entries and quotas must parse; a quota needs clients that can be told apart."""
        try:
            names = {t.name for t in parse_tokens(self.api_tokens)}
            quotas = parse_quotas(self.enqueue_quotas)
        except ConfigError as err:
            return [(False, str(err))]
        unknown = sorted(set(quotas) - names)
        return [
            (not quotas or self.auth_enabled,
             "TASKLINE_ENQUEUE_QUOTAS needs authentication: a client is known by its token"),
            (self.jwt_enabled or not unknown or not self.auth_enabled,
             f"TASKLINE_ENQUEUE_QUOTAS names {unknown!r}, which no TASKLINE_API_TOKENS entry "
             "names (and no JWT is accepted)"),
        ]

    @property
    def transaction_pooled(self) -> bool:
        """DATABASE_URL is a transaction pooler: its connections keep no session."""
        return self.database_pooling == "transaction"

    @property
    def session_url(self) -> str | None:
        """The DSN of a connection that keeps its session (LISTEN, session locks): DATABASE_URL
        unless it is transaction-pooled, then TASKLINE_DATABASE_DIRECT_URL; None when there is
        none (LISTEN falls back to polling)."""
        if not self.transaction_pooled:
            return self.database_url
        return self.database_direct_url or None

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
        """Seconds between retention passes: a tenth of the shortest retention set, between
        one and 10 reaper intervals (50 s with the defaults). A short retention is pruned in
        small steps, so the history tables hold the retention window and little more."""
        shortest = min((s for s in self.retention_s.values() if s > 0), default=float("inf"))
        return min(max(shortest / 10, self.reaper_interval_s), 10 * self.reaper_interval_s)

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


def valid_schema(name: str) -> bool:
    """Whether `name` may be TASKLINE_SCHEMA: written into SQL unquoted, so it must need no
    quoting and cannot be read as anything but one identifier."""
    return _SCHEMA_NAME.fullmatch(name) is not None and not name.startswith("pg_")


def allowed_host_entry(entry: str) -> bool:
    """Whether `entry` may stand in TASKLINE_ALLOWED_HOSTS: `*`, a host name or an IP literal."""
    if entry == "*" or _HOST_NAME.fullmatch(entry):
        return True
    try:
        ipaddress.ip_address(entry.strip("[]"))
    except ValueError:
        return False
    return True


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
        if kind == "bool":
            return _boolean(raw)
        return raw
    except ValueError:
        raise ConfigError(f"{_env_name(f.name)}={raw!r} is not a valid {kind}") from None


def _boolean(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise ValueError(raw)


__all__ = ["Settings", "env_names"]
