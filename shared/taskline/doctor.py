"""`taskline doctor`: what operators get wrong about the servers taskline runs on, each found
and said with how to fix it.

Invariant: every check is a pure function of facts read once (`PostgresFacts`, `RedisFacts`,
the deployment's `Plan`), so each verdict is tested without servers; only `read_postgres`,
`read_redis` and `session_reachable` do I/O, each bounded by a short timeout, and a server that
cannot be read turns the checks that need it into `skip`, never into a hang. A `fail` is a
setup that loses jobs or breaks under load; a `warn` works but is worse than it should be.
"""

from __future__ import annotations

import enum
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

import psycopg
import redis
from psycopg import sql
from redis.exceptions import RedisClusterException

from taskline.dispatch.connection import make_client
from taskline.dispatch.keys import QUEUES_SET, split_partition
from taskline.errors import redact
from taskline.settings import Settings

log = logging.getLogger(__name__)

MIN_POSTGRES = 13
"""Oldest PostgreSQL major version taskline runs on: its statements use pg_current_snapshot()
and gen_random_uuid(), both new in 13."""
MIN_REDIS = (6, 2)
"""Oldest Redis taskline runs on: claims use LMOVE and BLMOVE, new in 6.2."""
MAX_SKEW_S = 1.0
"""Largest difference between this host's clock and PostgreSQL's that passes, seconds: leases
are PostgreSQL's time, but retry and schedule scores, JWT expiry and log times are the host's,
and schedules promise a slot within 1 s."""
NEAR_FULL = 0.8
"""Share of the free PostgreSQL connections the deployment may take before it is a warning."""
TIMEOUT_S = 3
"""Connect and read timeout of each server the doctor asks, seconds."""

# What one process of each kind may hold at once; tests/unit/test_doctor.py keeps these equal to the
# services' own (taskline_worker.worker, taskline_producer.operations.backends, maintenance main).
WORKER_EXTRA_CONNECTIONS = 5
"""Pooled connections of a worker beyond its concurrency (fetch loops, lease keeper,
recorder, heartbeat); its pool may overflow by its size again."""
API_POOL_SIZE = 10
"""Pooled connections of one API process (a gunicorn worker), without overflow."""
MAINTENANCE_POOL_SIZE = 4
"""Pooled connections of one maintenance process; its pool may overflow by its size again."""


class Status(enum.StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"


@dataclass(frozen=True)
class Check:
    """One check's verdict: `detail` says what was found, `fix` how to repair it."""

    name: str
    status: Status
    detail: str
    fix: str = ""

    def line(self, width: int = 11) -> str:
        """One line: status, name padded to `width` (a table's widest name lines its details
        up), detail and fix."""
        text = f"{self.status.value:<4}  {self.name:<{width}} {self.detail}"
        return f"{text}; fix: {self.fix}" if self.fix else text

    def as_dict(self) -> dict[str, str]:
        return {**asdict(self), "status": self.status.value}


@dataclass(frozen=True)
class Plan:
    """The processes of one deployment that share its PostgreSQL: what the connection check
    adds up. The defaults are one of each, as `taskline api` and `taskline worker` start."""

    workers: int = 1
    concurrency: int = 16
    api_processes: int = 2
    maintenance: int = 1

    def pooled(self) -> int:
        """Most pooled connections the deployment may hold at once (every overflow used)."""
        worker = 2 * (self.concurrency + WORKER_EXTRA_CONNECTIONS)
        return (self.workers * worker + self.api_processes * API_POOL_SIZE
                + self.maintenance * 2 * MAINTENANCE_POOL_SIZE)

    def sessions(self) -> int:
        """Connections that keep a session: a worker's LISTEN while Redis is down, and the
        maintenance outbox relay's."""
        return self.workers + self.maintenance


@dataclass(frozen=True)
class PostgresFacts:
    version_num: int
    version: str
    autovacuum: str
    track_counts: str
    max_connections: int
    reserved: int
    others: int
    """Client connections open now that are not taskline's (nor this one)."""
    skew_s: float
    """PostgreSQL's clock minus this host's, seconds."""
    skew_error_s: float
    """Half the round trip the clock was read in: the skew's uncertainty, seconds."""
    revision: str | None
    """The schema's migration revision; None when it has no version table."""
    partitions: dict[str, tuple[int, bool]] | None = None
    """Per partitioned history table (migration 0021): partitions ready past the one being
    written, and whether its default partition holds rows; None before 0021."""


@dataclass(frozen=True)
class RedisFacts:
    version: str
    maxmemory_policy: str
    maxmemory: int
    cluster_enabled: bool
    cluster_state: str
    cluster_size: int
    db: int
    partitions_found: int = 1
    """1 + the highest queue partition the queues set names (TASKLINE_QUEUE_PARTITIONS)."""


# --- the checks (pure) -----------------------------------------------------------------------

def check_postgres(facts: PostgresFacts | str) -> Check:
    """Reachable, and at least MIN_POSTGRES."""
    if isinstance(facts, str):
        return Check("postgres", Status.FAIL, f"unreachable: {facts}",
                     "start PostgreSQL or correct DATABASE_URL")
    if facts.version_num // 10000 < MIN_POSTGRES:
        return Check("postgres", Status.FAIL, f"PostgreSQL {facts.version} is too old",
                     f"upgrade to PostgreSQL {MIN_POSTGRES} or newer")
    return Check("postgres", Status.OK, f"PostgreSQL {facts.version}")


def check_redis(facts: RedisFacts | str) -> Check:
    """Reachable, and at least MIN_REDIS."""
    if isinstance(facts, str):
        return Check("redis", Status.FAIL, f"unreachable: {facts}",
                     "start Redis or correct REDIS_URL")
    if _version_tuple(facts.version) < MIN_REDIS:
        return Check("redis", Status.FAIL, f"Redis {facts.version} is too old",
                     f"upgrade to Redis {'.'.join(map(str, MIN_REDIS))} or newer (LMOVE, "
                     "BLMOVE)")
    return Check("redis", Status.OK, f"Redis {facts.version}")


def check_schema(facts: PostgresFacts | str, schema: str, head: str | None,
                 known: Iterable[str] = ()) -> Check:
    """The installation in `schema` is at the newest revision this release knows."""
    if isinstance(facts, str):
        return _skipped("schema", "PostgreSQL")
    if facts.revision is None:
        return Check("schema", Status.FAIL, f"schema {schema} is not migrated",
                     "run `taskline migrate`")
    if facts.revision == head:
        return Check("schema", Status.OK, f"schema {schema} at revision {head} (newest)")
    if facts.revision not in set(known):
        return Check("schema", Status.WARN,
                     f"schema {schema} at revision {facts.revision}, newer than this release "
                     f"knows ({head})", "upgrade this host's taskline to the migrated release")
    return Check("schema", Status.FAIL, f"schema {schema} at revision {facts.revision}, "
                 f"not the newest ({head})", "run `taskline migrate`")


def check_autovacuum(facts: PostgresFacts | str) -> Check:
    """autovacuum (and the statistics it works from) on: retention deletes rows all day."""
    if isinstance(facts, str):
        return _skipped("autovacuum", "PostgreSQL")
    if facts.autovacuum != "on" or facts.track_counts != "on":
        return Check("autovacuum", Status.FAIL,
                     f"autovacuum = {facts.autovacuum}, track_counts = {facts.track_counts}: "
                     "deleted jobs' space is never reused and the tables and indexes grow",
                     "set autovacuum = on and track_counts = on in postgresql.conf "
                     "(ALTER SYSTEM SET autovacuum = on; SELECT pg_reload_conf())")
    return Check("autovacuum", Status.OK, "autovacuum on")


def check_history_partitions(facts: PostgresFacts | str, wanted: int) -> Check:
    """Partitions of job_events and job_leases exist ahead of the ones being written:
    maintenance creates `wanted` of them on every retention pass (taskline.store.partitions)."""
    if isinstance(facts, str):
        return _skipped("history_partitions", "PostgreSQL")
    if facts.partitions is None:
        return Check("history_partitions", Status.SKIP,
                     "history tables not partitioned (before 0021)")
    ahead = min(n for n, _ in facts.partitions.values())
    spilled = sorted(t for t, (_, rows) in facts.partitions.items() if rows)
    detail = ", ".join(f"{t}: {n} ahead" for t, (n, _) in sorted(facts.partitions.items()))
    if ahead == 0 or spilled:
        return Check("history_partitions", Status.FAIL,
                     f"{detail}" + (f"; rows in the default partition of {', '.join(spilled)}"
                                    if spilled else "; the next roll has no partition"),
                     "run `taskline maintenance` (its retention pass creates them)")
    if ahead < wanted:
        return Check("history_partitions", Status.WARN, f"{detail} (maintenance keeps {wanted})",
                     "check that a `taskline maintenance` leads and its retention runs")
    return Check("history_partitions", Status.OK, detail)


def check_eviction(facts: RedisFacts | str) -> Check:
    """maxmemory-policy noeviction: an evicting Redis drops queued ids silently."""
    if isinstance(facts, str):
        return _skipped("eviction", "Redis")
    if facts.maxmemory_policy != "noeviction":
        limit = f"maxmemory {facts.maxmemory} bytes" if facts.maxmemory else "no maxmemory yet"
        return Check("eviction", Status.FAIL,
                     f"maxmemory-policy {facts.maxmemory_policy} ({limit}): a full Redis "
                     "drops queued ids, and jobs wait for reconciliation",
                     "CONFIG SET maxmemory-policy noeviction (and in redis.conf), or use a "
                     "Redis of its own for taskline")
    return Check("eviction", Status.OK, "maxmemory-policy noeviction")


def check_cluster(facts: RedisFacts | str) -> Check:
    """Standalone, or a healthy Redis Cluster reached through its database 0."""
    if isinstance(facts, str):
        return _skipped("cluster", "Redis")
    if not facts.cluster_enabled:
        return Check("cluster", Status.OK, "standalone Redis (not a cluster)")
    if facts.db != 0:
        return Check("cluster", Status.FAIL,
                     f"REDIS_URL names database {facts.db}, a Redis Cluster has only 0",
                     "drop the database number from REDIS_URL")
    if facts.cluster_state != "ok":
        return Check("cluster", Status.FAIL, f"Redis Cluster state {facts.cluster_state}",
                     "repair the cluster (CLUSTER INFO, redis-cli --cluster check)")
    return Check("cluster", Status.OK,
                 f"Redis Cluster, {facts.cluster_size} masters, state ok")


def check_queue_partitions(facts: RedisFacts | str, partitions: int) -> Check:
    """TASKLINE_QUEUE_PARTITIONS agrees with the partitions Redis holds, and has a use."""
    if isinstance(facts, str):
        return _skipped("queue_partitions", "Redis")
    if facts.partitions_found > partitions:
        return Check("queue_partitions", Status.WARN,
                     f"Redis holds queue partitions up to {facts.partitions_found - 1}, "
                     f"TASKLINE_QUEUE_PARTITIONS is {partitions}: a service runs with a larger "
                     "setting, or reconciliation has not moved them yet",
                     "give every service the same TASKLINE_QUEUE_PARTITIONS")
    if partitions > 1 and not facts.cluster_enabled:
        return Check("queue_partitions", Status.WARN,
                     f"TASKLINE_QUEUE_PARTITIONS is {partitions} on a standalone Redis: every "
                     "partition is on the same server, each idle fetch costs more",
                     "set TASKLINE_QUEUE_PARTITIONS=1 unless Redis is a cluster")
    return Check("queue_partitions", Status.OK, f"{partitions} Redis partition(s) per queue")


def check_clock(facts: PostgresFacts | str, max_skew_s: float = MAX_SKEW_S) -> Check:
    """This host's clock within `max_skew_s` of PostgreSQL's."""
    if isinstance(facts, str):
        return _skipped("clock", "PostgreSQL")
    found = f"this host's clock is {abs(facts.skew_s):.3f} s " + (
        "behind" if facts.skew_s > 0 else "ahead of") + \
        f" PostgreSQL's (± {facts.skew_error_s:.3f} s)"
    if abs(facts.skew_s) - facts.skew_error_s > max_skew_s:
        return Check("clock", Status.FAIL, found,
                     "synchronise the clocks of this host and the database server (NTP, "
                     "chrony)")
    return Check("clock", Status.OK, found)


def check_connections(facts: PostgresFacts | str, plan: Plan,
                      transaction_pooled: bool = False) -> Check:
    """The deployment's connections fit in PostgreSQL's max_connections, with what others use.

    Behind a transaction pooler PostgreSQL sees the pooler's server connections (its own pool
    size) and the sessions only: those are what must fit then."""
    if isinstance(facts, str):
        return _skipped("connections", "PostgreSQL")
    free = facts.max_connections - facts.reserved - facts.others
    wanted = plan.sessions() if transaction_pooled else plan.pooled() + plan.sessions()
    what = ("sessions (pooled connections are the pooler's to bound)" if transaction_pooled
            else "connections")
    found = (f"up to {wanted} {what} for {plan.workers} worker(s) of concurrency "
             f"{plan.concurrency}, {plan.api_processes} API process(es), {plan.maintenance} "
             f"maintenance; {free} of max_connections {facts.max_connections} free")
    if wanted > free:
        return Check("connections", Status.FAIL, found,
                     "raise max_connections, lower --concurrency or the process counts, or "
                     "put PgBouncer in front (TASKLINE_DATABASE_POOLING=transaction)")
    if wanted > NEAR_FULL * free:
        return Check("connections", Status.WARN, found,
                     "leave headroom: raise max_connections or lower the pool sizes")
    return Check("connections", Status.OK, found)


def check_session(settings: Settings, direct: str | None) -> Check:
    """Where LISTEN and `migrate`'s lock get a session: `direct` is None when the direct URL
    answered (or is not needed), else why it did not."""
    if not settings.transaction_pooled:
        return Check("session", Status.OK, "DATABASE_URL keeps sessions (LISTEN, locks)")
    if not settings.database_direct_url:
        return Check("session", Status.WARN,
                     "transaction pooling without TASKLINE_DATABASE_DIRECT_URL: wake-ups poll "
                     "(up to 1 s) instead of LISTEN, and `taskline migrate` cannot run",
                     "set TASKLINE_DATABASE_DIRECT_URL to PostgreSQL itself (or a session "
                     "pool)")
    if direct is not None:
        return Check("session", Status.FAIL,
                     f"TASKLINE_DATABASE_DIRECT_URL unreachable: {direct}",
                     "correct TASKLINE_DATABASE_DIRECT_URL")
    return Check("session", Status.OK, "TASKLINE_DATABASE_DIRECT_URL answers (LISTEN, locks)")


def failed(checks: Iterable[Check]) -> bool:
    return any(c.status is Status.FAIL for c in checks)


def _skipped(name: str, server: str) -> Check:
    return Check(name, Status.SKIP, f"{server} unreachable")


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


# --- reading the servers (I/O) -------------------------------------------------------------

_POSTGRES_FACTS = """
SELECT current_setting('server_version_num')::int, current_setting('server_version'),
       current_setting('autovacuum'), current_setting('track_counts'),
       current_setting('max_connections')::int,
       current_setting('superuser_reserved_connections')::int,
       (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'
          AND pid <> pg_backend_pid() AND application_name NOT LIKE 'taskline%%')::int,
       extract(epoch FROM clock_timestamp())::float8,
       to_regclass(%s) IS NOT NULL
"""


def read_postgres(url: str, schema: str, *, transaction_pooled: bool = False,
                  clock: Callable[[], float] = time.time) -> PostgresFacts | str:
    """The facts of the PostgreSQL at `url`, or why it could not be read."""
    version_table = f"{schema}.alembic_version"
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=TIMEOUT_S,
                             application_name="taskline-doctor",
                             prepare_threshold=None if transaction_pooled else 5) as conn:
            sent = clock()
            row = conn.execute(_POSTGRES_FACTS, (version_table,)).fetchone()
            received = clock()
            assert row is not None
            revision = None
            if row[8]:
                found = conn.execute(sql.SQL("SELECT version_num FROM {}.alembic_version")
                                     .format(sql.Identifier(schema))).fetchone()
                revision = found[0] if found else None
            partitions = _partitions(conn, schema)
    except psycopg.Error as err:
        return _said(err)
    return PostgresFacts(version_num=row[0], version=row[1], autovacuum=row[2],
                         track_counts=row[3], max_connections=row[4], reserved=row[5],
                         others=row[6], skew_s=row[7] - (sent + received) / 2,
                         skew_error_s=(received - sent) / 2, revision=revision,
                         partitions=partitions)


_BOUND_FROM = re.compile(r"FROM \('?(-?\d+)'?\)")


def _partitions(conn: psycopg.Connection, schema: str) -> dict[str, tuple[int, bool]] | None:
    """Per history table: partitions whose first id is past the sequence, and whether its
    default partition holds rows; None when the tables are not partitioned."""
    out: dict[str, tuple[int, bool]] = {}
    for table in ("job_events", "job_leases"):
        name = f"{schema}.{table}"
        row = conn.execute("SELECT pg_get_serial_sequence(%s, 'id') FROM pg_partitioned_table "
                           "WHERE partrelid = to_regclass(%s)", (name, name)).fetchone()
        if row is None:
            return None
        last, called = conn.execute(sql.SQL("SELECT last_value, is_called FROM {}").format(
            sql.SQL(row[0]))).fetchone() or (0, False)
        nxt = int(last) + int(bool(called))
        bounds = conn.execute("SELECT pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
                              "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = "
                              "to_regclass(%s)", (name,)).fetchall()
        lowers = [int(m.group(1)) for (b,) in bounds if (m := _BOUND_FROM.search(b))]
        spilled = conn.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {})").format(
            sql.Identifier(schema, f"{table}_default"))).fetchone()
        out[table] = (sum(1 for low in lowers if low > nxt), bool(spilled and spilled[0]))
    return out


def read_redis(url: str) -> RedisFacts | str:
    """The facts of the Redis at `url` (any node of a cluster), or why it could not be read."""
    # `redis+cluster://` asks the services for cluster mode; the node itself answers INFO.
    node = re.sub(r"^(rediss?)\+cluster://", r"\1://", url)
    client = redis.Redis.from_url(node, socket_timeout=TIMEOUT_S,
                                  socket_connect_timeout=TIMEOUT_S, decode_responses=True)
    try:
        server, memory = client.info("server"), client.info("memory")
        enabled = bool(int(client.info("cluster").get("cluster_enabled", 0)))
        cluster = client.execute_command("CLUSTER INFO") if enabled else {}
        found = _partitions_found(url, enabled)
    except redis.RedisError as err:
        return _said(err)
    finally:
        client.close()
    cluster = _cluster_info(cluster)
    return RedisFacts(version=str(server.get("redis_version", "?")),
                      maxmemory_policy=str(memory.get("maxmemory_policy", "?")),
                      maxmemory=int(memory.get("maxmemory", 0)), cluster_enabled=enabled,
                      cluster_state=str(cluster.get("cluster_state", "?")),
                      cluster_size=int(cluster.get("cluster_size", 0)), db=_redis_db(url),
                      partitions_found=found)


def _partitions_found(url: str, cluster: bool) -> int:
    """1 + the highest partition the queues set names (it lives on one node of a cluster);
    1 when it cannot be read (a cluster without its slots: the cluster check says so)."""
    try:
        client = make_client(url, TIMEOUT_S, cluster=cluster, connect_timeout=TIMEOUT_S)
        try:
            names = client.smembers(QUEUES_SET)
        finally:
            client.close()
    except (redis.RedisError, RedisClusterException):
        return 1
    return 1 + max((split_partition(name)[1] for name in names), default=0)


def session_reachable(url: str) -> str | None:
    """None when a session at `url` opens, else why not."""
    try:
        psycopg.connect(url, connect_timeout=TIMEOUT_S,
                        application_name="taskline-doctor").close()
    except psycopg.Error as err:
        return _said(err)
    return None


def _cluster_info(raw: Any) -> dict[str, str]:
    """CLUSTER INFO as a dict, however the client parsed it (text or already a dict)."""
    if isinstance(raw, dict):
        return {str(k): str(v) for k, v in raw.items()}
    pairs = (line.split(":", 1) for line in str(raw).splitlines() if ":" in line)
    return {k.strip(): v.strip() for k, v in pairs}


def _redis_db(url: str) -> int:
    path = urlsplit(url).path.strip("/")
    return int(path) if path.isdigit() else 0


def _said(err: BaseException) -> str:
    """A driver's error on one line, without passwords."""
    text = " ".join(str(err).split()) or type(err).__name__
    return redact(text)


_REVISION = re.compile(r"^(down_)?revision\s*=\s*(?:['\"]([^'\"]+)['\"]|None)", re.MULTILINE)


def revisions(texts: Iterable[str]) -> tuple[str | None, list[str]]:
    """The head revision and every revision, from the migration files' texts: the head is
    the one revision no other names as its `down_revision` (None if that is not exactly one)."""
    known, parents = [], set()
    for text in texts:
        for match in _REVISION.finditer(text):
            if match.group(2) is None:
                continue
            (parents.add if match.group(1) else known.append)(match.group(2))
    heads = [r for r in known if r not in parents]
    return (heads[0] if len(heads) == 1 else None), known


def migration_revisions() -> tuple[str | None, list[str]]:
    """`revisions` of this release's migrations, read as text (importing Alembic and running
    every migration module would cost a service's start most of a second)."""
    folder = resources.files("taskline_migrations") / "versions"
    return revisions(f.read_text() for f in folder.iterdir()
                     if f.name.endswith(".py") and not f.name.startswith("__"))


# --- all of it ---------------------------------------------------------------------------

def run_checks(settings: Settings, plan: Plan, *,
               clock: Callable[[], float] = time.time) -> list[Check]:
    """Every check, in a fixed order, against the servers `settings` names."""
    postgres = read_postgres(settings.database_url, settings.schema,
                             transaction_pooled=settings.transaction_pooled, clock=clock)
    redis_facts = read_redis(settings.redis_url)
    direct = (session_reachable(settings.database_direct_url)
              if settings.transaction_pooled and settings.database_direct_url else None)
    head, known = migration_revisions()
    return [
        check_postgres(postgres),
        check_schema(postgres, settings.schema, head, known),
        check_autovacuum(postgres),
        check_history_partitions(postgres, settings.history_partitions_ahead),
        check_clock(postgres),
        check_connections(postgres, plan, settings.transaction_pooled),
        check_session(settings, direct),
        check_redis(redis_facts),
        check_eviction(redis_facts),
        check_cluster(redis_facts),
        check_queue_partitions(redis_facts, settings.queue_partitions),
    ]


def warn_at_start(settings: Settings, plan: Plan) -> threading.Thread:
    """Log every check that is not ok as a WARNING, on a daemon thread, so a service's start
    waits for none of it. Returns the thread (tests join it)."""
    def body() -> None:
        try:
            checks = run_checks(settings, plan)
        except Exception:  # a doctor that fails must never stop the service it advises
            log.exception("doctor checks failed", extra={"action": "doctor"})
            return
        for check in checks:
            if check.status in (Status.FAIL, Status.WARN):
                log.warning("doctor: %s: %s%s", check.name, check.detail,
                            f"; fix: {check.fix}" if check.fix else "",
                            extra={"action": "doctor", "check": check.name,
                                   "status": check.status.value})

    thread = threading.Thread(target=body, name="taskline-doctor", daemon=True)
    thread.start()
    return thread
