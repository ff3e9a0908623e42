"""The store: the one class that runs taskline's SQL against PostgreSQL, and its jobs' statements.

Method names are the query names of store/sql. Each method is one statement, run alone in
autocommit (one round trip) unless the caller passes a connection of its own transaction.
Driver errors that mean "PostgreSQL is unreachable" become StoreUnavailable here, so services
never catch driver exceptions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import re
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
import psycopg
from psycopg.pq import ExecStatus
from psycopg.rows import namedtuple_row
from sqlalchemy import Connection, Engine, create_engine, event, exc
from sqlalchemy.dialects.postgresql import psycopg as sqlalchemy_psycopg
from sqlalchemy.engine import ExceptionContext

from taskline import flow, transitions
from taskline.errors import QueueLimitReached, StoreUnavailable
from taskline.jobs import Job, Outcome, Status, new_job_id
from taskline.store import bulk, watching
from taskline.store.aggregate import Aggregate
from taskline.store.audit import AuditTrail
from taskline.store.deadletters import DeadFilter as DeadFilter  # callers import it from here
from taskline.store.deadletters import DeadLetters

# Kept under the names this module always used (and that bulk, caller and the tests import).
from taskline.store.params import FIRST_EVENTS as _FIRST_EVENTS
from taskline.store.params import json_text as _json
from taskline.store.params import move_params as _move_params
from taskline.store.params import rows_json as _rows_json
from taskline.store.params import uuid_array as _uuid_array
from taskline.store.params import uuids as _uuids
from taskline.store.partitions import HistoryPartitions
from taskline.store.queries import DEFAULT_SCHEMA, queries_for
from taskline.store.rows import (
    CONDITION_UNMET,
    Deleted,
    Expired,
    Owed,
    Promoted,
    Recovered,
    Released,
    ScheduleRow,
    Settled,
    Settlement,
    Turn,
)
from taskline.store.schedules import Schedules
from taskline.store.workers import Workers
from taskline.store.workflows import Workflows
from taskline.transitions import Move
from taskline.uniquespec import unique_lock

QUERIES = queries_for(DEFAULT_SCHEMA)
"""The statements for the default schema (what tests and tools read; a Store runs its own)."""


def sqlalchemy_url(url: str) -> str:
    """The SQLAlchemy form of a libpq URL: psycopg 3 as the driver."""
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    raise ValueError("DATABASE_URL must start with postgresql://")


def make_engine(url: str, pool_size: int = 5, max_overflow: int | None = None, *,
                transaction_pooled: bool = False, generic_plans: bool = False,
                **kwargs: Any) -> Engine:
    """An engine with a fixed pool and TCP keepalives, so a dead link is noticed in seconds.

    `max_overflow` (default: `pool_size` again) connections beyond the pool are opened when all
    of it is in use and closed as soon as they are returned to a full pool.
    `transaction_pooled`: `url` is a transaction pooler (PgBouncer's pool_mode=transaction),
    whose server connections pass from client to client between transactions, so psycopg
    prepares nothing there (a statement prepared on one server connection is missing on the
    next, and its name taken on it by another client).
    `generic_plans`: every prepared statement runs the plan made at its preparation
    (plan_cache_mode = force_generic_plan on each connection), for a process whose statements
    find their rows by ids and literal states, as the worker's do. Left to choose, PostgreSQL
    plans such a statement again at every call whenever its estimates favour a plan for the
    call's values, and once `jobs` held a few thousand rows they favoured one for the claim:
    1.17 against 0.44 ms a claim of one id at 20,000 jobs (docs/performance.md, change 95).
    Not for statements with optional filters (`:x IS NULL OR ...`), whose plan depends on the
    values, and not on a transaction pooler, where nothing is prepared and a session setting
    would pass to other clients.
    """
    connect_args: dict[str, Any] = {
        "connect_timeout": 5,
        "keepalives": 1,
        "keepalives_idle": 5,
        "keepalives_interval": 2,
        "keepalives_count": 3,
        "application_name": kwargs.pop("application_name", "taskline"),
    }
    if transaction_pooled:
        connect_args["prepare_threshold"] = None
    engine = create_engine(
        sqlalchemy_url(url), pool_size=pool_size,
        max_overflow=pool_size if max_overflow is None else max_overflow, pool_timeout=10,
        pool_recycle=3600, connect_args=connect_args, json_deserializer=_json_loads, **kwargs,
    )
    event.listen(engine, "handle_error", _outdated_plans_invalidate_the_pool)
    if generic_plans and not transaction_pooled:
        event.listen(engine, "connect", _force_generic_plans)
    return engine


def _force_generic_plans(dbapi_connection: Any, _record: Any) -> None:
    """A new connection runs its prepared statements' generic plans (make_engine)."""
    with dbapi_connection.cursor() as cursor:
        cursor.execute("SET plan_cache_mode = force_generic_plan")
    dbapi_connection.commit()


def outdated_plan(err: BaseException) -> bool:
    """Whether `err` is PostgreSQL refusing a prepared statement whose result's columns a
    schema change altered (a migration adding a column to `jobs` alters every `RETURNING *`).

    Nothing ran: the plan is checked before execution. Every prepared statement of every
    connection opened before the change is just as outdated, and outside a transaction psycopg
    keeps running them under their prepared names, so a connection would fail that statement
    on every call until it is closed (pool_recycle: an hour), in a process of either release
    while a rolling deploy's migration runs beside it.
    """
    return isinstance(err, psycopg.errors.FeatureNotSupported) \
        and "cached plan must not change result type" in str(err)


def _outdated_plans_invalidate_the_pool(context: ExceptionContext) -> None:
    """SQLAlchemy's handle_error: treat an outdated plan as a lost connection, so the whole
    pool is replaced and the statement surfaces as StoreUnavailable, which every caller
    already retries (translate_errors)."""
    if outdated_plan(context.original_exception):
        context.is_disconnect = True


_LONG_DIGITS = re.compile(rb"[0-9]{19}")
_LONG_DIGITS_STR = re.compile(r"[0-9]{19}")


def _json_loads(data: str | bytes) -> Any:
    """jsonb values (payloads, results, details) as Python, by orjson (every returned payload
    went through json.loads, a visible share of an API process's time under batch enqueues).

    orjson reads an integer past 64 bits as a float, and jsonb holds any integer: a document
    with a run of 19 digits goes to the standard library, exact. So does one orjson refuses.
    """
    text = bytes(data) if isinstance(data, memoryview) else data
    long_run = _LONG_DIGITS_STR if isinstance(text, str) else _LONG_DIGITS
    if long_run.search(text) is None:
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    return json.loads(text)


@dataclass(frozen=True)
class Claimed:
    """A job this worker won, with the lease that fences every write of this attempt."""

    job: Job
    lease_id: int
    leased_until: datetime


def _without_job_id(row: Any) -> dict:
    entry = dict(row._mapping)
    del entry["job_id"]
    return entry


PREPARE = True
"""The statements run straight through psycopg are prepared on a connection's first run of
each, not its sixth (psycopg's default threshold). Until prepared, every run is parsed,
rewritten and planned anew, and the settle-and-release statement expands views into a plan
that took about as long to make as to run: a worker's connections are new after every start
and every hour (pool_recycle), and a chain's handoffs on a new worker took twice as long
(docs/performance.md). Each is one fixed text of store/sql, so the prepared set is bounded."""


@functools.cache
def driver_sql(name: str, schema: str = DEFAULT_SCHEMA) -> str:
    """Query `name` for `schema` in psycopg's own parameter style, for statements run straight
    through psycopg (Store._run_on_driver, Store._driver_transaction, taskline.store.caller)."""
    return str(queries_for(schema)[name].compile(dialect=sqlalchemy_psycopg.dialect()))


def has_rows(cursor: psycopg.Cursor | psycopg.AsyncCursor) -> bool:
    """Whether the cursor's last statement returned a result set (so `fetchall` may be called).
    Read from the result's status: `cursor.description` would build a Column per column, about
    90 Python bytecode instructions each, only to be compared with None (a third of the
    library's single enqueue's Python once its result had four columns; docs/performance.md)."""
    result = cursor.pgresult
    return result is not None and result.status == _TUPLES_OK


_TUPLES_OK = ExecStatus.TUPLES_OK


class Store(DeadLetters, Workflows, Schedules, Workers, AuditTrail, Aggregate):
    """Runs named queries; every unreachable-database error surfaces as StoreUnavailable.

    The jobs' own statements (enqueue, claim, settle, moves, maintenance passes) are here; each
    other aggregate's are its mixin's (taskline.store.deadletters, workflows, schedules,
    workers, audit), so a caller holds one `Store` and calls every method on it."""

    max_queues: int = 1000
    """TASKLINE_MAX_QUEUES (its default until a service sets it), which every insert of new
    jobs enforces: QueueLimitReached, nothing written."""

    def __init__(self, engine: Engine, schema: str = DEFAULT_SCHEMA, *,
                 prepare: bool = PREPARE) -> None:
        self.engine = engine
        self.schema = schema
        self._queries = queries_for(schema)
        self._prepare = prepare
        """Whether the statements run straight through psycopg are prepared (see PREPARE):
        never on a transaction pooler's connections."""

    @property
    def partitions(self) -> HistoryPartitions:
        """Upkeep of the history tables' partitions (created ahead, rolled, expired)."""
        return HistoryPartitions(self.engine, self.schema)

    @classmethod
    def connect(cls, url: str, pool_size: int = 5, max_overflow: int | None = None,
                schema: str = DEFAULT_SCHEMA, *, transaction_pooled: bool = False,
                **kwargs: Any) -> Store:
        """A store on its own engine; `transaction_pooled` as in make_engine."""
        engine = make_engine(url, pool_size=pool_size, max_overflow=max_overflow,
                             transaction_pooled=transaction_pooled, **kwargs)
        return cls(engine, schema, prepare=PREPARE and not transaction_pooled)

    def dispose(self) -> None:
        self.engine.dispose()

    def open_connections(self, count: int) -> None:
        """Open `count` pooled connections now and leave them idle in the pool (at most its
        size stay), so the first statements of a busy moment do not each pay a connection's
        set-up: two or three round trips (TLS request, start-up, authentication), which on a
        slow link took longer than the statement and were counted against a new lease."""
        held = []
        try:
            with translate_errors(), translate_driver_errors(None):
                for _ in range(count):
                    held.append(self.engine.raw_connection())
        finally:
            for pooled in held:
                pooled.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A connection inside one transaction, committed on success."""
        with translate_errors(), self.engine.begin() as conn:
            yield conn

    def _run(self, name: str, params: dict[str, Any], conn: Connection | None = None) -> list:
        """Run query `name`; the rows it returns, or [] for a statement without rows.

        Without `conn` the statement runs alone in autocommit mode: one statement is atomic by
        itself, and this spares the BEGIN and COMMIT round trips, which on a slow link would
        triple the time every claim, renewal and completion takes.
        """
        if conn is not None:
            with translate_errors():
                result = conn.execute(self._queries[name], params)
                return result.all() if result.returns_rows else []
        with translate_errors(), self.engine.connect() as own:
            return self._run(name, params, own.execution_options(isolation_level="AUTOCOMMIT"))

    # --- producer side -------------------------------------------------------------------

    def insert_job(self, conn: Connection, **fields: Any) -> Job | None:
        """Insert a job; None when its idempotency key already exists in its queue."""
        params = {"run_at": None, "delay_s": 0.0, "trace_context": None, "limit_key": None,
                  "ordering_key": None, "tags": None, "expires_at": None,
                  "start_within_s": None, **fields}
        params["payload"] = _json(params["payload"])
        params["tags"] = None if params["tags"] is None else list(params["tags"])
        rows = self._run("insert_job", params, conn)
        return Job.from_row(rows[0]) if rows else None

    def insert_event(self, conn: Connection | None, job_id: uuid.UUID, attempt: int, event: str,
                     worker_id: str | None = None, detail: Any = None) -> None:
        self._run("insert_event", {"job_id": job_id, "attempt": attempt, "event": event,
                                   "worker_id": worker_id, "detail": _json(detail)}, conn)

    def insert_jobs_with_events(self, jobs: Sequence[dict[str, Any]],
                                conn: Connection | None = None) -> list:
        """Insert jobs (insert_job's fields each, in the order given) and each one's first event
        (`scheduled` for a scheduled job, else `enqueued`) in one statement: without `conn` it
        runs in autocommit, one round trip, and still writes a job and its event together.

        A job whose idempotency key already exists in its queue (or earlier in `jobs`) is
        skipped. Returns (id, payload, next_run_at, created_at, updated_at) of each inserted
        job, in no guaranteed order. Without `conn`, a large batch without keys is written by
        COPY (taskline.store.bulk), in one transaction of its own; its payloads are returned as
        given rather than read back from jsonb (equal values; object keys in the given order).
        """
        if not jobs:
            return []
        if conn is None and bulk.copyable(jobs):
            with self._driver() as driver:
                return bulk.copy_jobs_with_events(driver, jobs, self.schema, self._queue_gate)
        params = {"jobs": _rows_json(jobs), "first_events": _FIRST_EVENTS,
                  "max_queues": self.max_queues}
        if conn is not None:
            return self._refusing(self._run("insert_jobs_with_events", params, conn))
        return self._refusing(self._run_on_driver("insert_jobs_with_events", params))

    def _refusing(self, rows: list) -> list:
        """`rows` of an insert, or QueueLimitReached when it refused them (one `refused` row:
        nothing was written)."""
        if rows and rows[0].refused is not None:
            raise QueueLimitReached(list(rows[0].refused), self.max_queues)
        return rows

    def _queue_gate(self, cursor: Any, queues: set[str]) -> None:
        """The queue limit of a COPY's jobs, checked on its transaction before it writes."""
        rows = cursor.execute(driver_sql("queue_limit_refused", self.schema),
                              {"queues": sorted(queues), "max_queues": self.max_queues}
                              ).fetchall()
        if rows:
            raise QueueLimitReached(list(rows[0][0]), self.max_queues)

    def _run_on_driver(self, name: str, params: dict[str, Any]) -> list:
        """Run query `name` alone in autocommit on a pooled connection, straight through psycopg.

        For the lone statements on the hot paths (a single enqueue, a claim, a batched
        completion): SQLAlchemy's execution layer (isolation switch, result metadata rebuilt for
        textual SQL) costs about as much CPU as the rest of a request, and a share of an idle
        worker's pickup (docs/performance.md). Prepared on its first run (see PREPARE).
        """
        with self._driver() as driver:
            driver.autocommit = True
            with driver.cursor(row_factory=namedtuple_row) as cursor:
                sql = driver_sql(name, self.schema)
                rows = cursor.execute(sql, params, prepare=self._prepare).fetchall()
            driver.autocommit = False
        return rows

    @contextlib.contextmanager
    def _driver_transaction(self) -> Iterator[Callable[[str, dict[str, Any]], list]]:
        """`run(name, params)` for statements of one transaction, straight through psycopg
        (the claims' multi-statement transactions, for the CPU `_run_on_driver` spares);
        committed when the block ends, rolled back if it raises."""
        with self._driver() as driver, driver.transaction(), \
                driver.cursor(row_factory=namedtuple_row) as cursor:
            def run(name: str, params: dict[str, Any]) -> list:
                cursor.execute(driver_sql(name, self.schema), params, prepare=self._prepare)
                return cursor.fetchall() if has_rows(cursor) else []

            yield run

    @contextlib.contextmanager
    def _driver(self) -> Iterator[psycopg.Connection]:
        """A pooled connection's psycopg connection, outside any transaction. Any error discards
        the connection, which may be broken, in autocommit or inside a transaction: the pool
        must never hand any of them to a transaction."""
        # raw_connection() passes the driver's own connect errors through, unwrapped.
        with translate_errors(), translate_driver_errors(None):
            pooled = self.engine.raw_connection()
        driver = pooled.driver_connection
        try:
            with translate_driver_errors(driver):
                yield driver
        except BaseException as err:
            pooled.invalidate(err)
            if isinstance(err, StoreUnavailable) and outdated_plan(err.__cause__):
                self.engine.dispose()  # every pooled connection's plans are outdated alike
            raise
        finally:
            pooled.close()

    def get_job_by_key(self, queue: str, key: str, conn: Connection | None = None) -> Job | None:
        rows = self._run("get_job_by_key", {"queue": queue, "idempotency_key": key}, conn)
        return Job.from_row(rows[0]) if rows else None

    def get_job_and_hash_by_key(self, queue: str, key: str,
                                conn: Connection | None = None) -> tuple[Job, str | None] | None:
        """The job holding an idempotency key and the request_hash of the call that created it."""
        rows = self._run("get_job_by_key", {"queue": queue, "idempotency_key": key}, conn)
        return (Job.from_row(rows[0]), rows[0].request_hash) if rows else None

    def get_job(self, job_id: uuid.UUID, conn: Connection | None = None) -> Job | None:
        rows = self._run("get_job", {"id": job_id}, conn)
        return Job.from_row(rows[0]) if rows else None

    def watch_finish(self, job_ids: Sequence[uuid.UUID | str] = (),
                     workflow_ids: Sequence[uuid.UUID | str] = ()) -> None:
        """Have the finish of these jobs (of these workflows' steps) signalled at its commit,
        before a waiter reads their state (taskline.store.watching)."""
        watching.watch_finish(self._run, job_ids, workflow_ids)

    def get_history(self, job_id: uuid.UUID) -> tuple[list[dict], list[dict]]:
        """A job's (events, leases), oldest first, in one transaction."""
        with self.transaction() as conn:
            events = [dict(r._mapping) for r in self._run("get_events", {"id": job_id}, conn)]
            leases = [dict(r._mapping) for r in self._run("get_leases", {"id": job_id}, conn)]
        return events, leases

    def finished_with_history(self, job_ids: Sequence[uuid.UUID | str]
                              ) -> dict[uuid.UUID, tuple[Job, list[dict], list[dict]]]:
        """{id: (job, events, leases)} of those of `job_ids` that are finished, as get_job and
        get_history read them, in three statements whatever their number (a burst of woken
        waiters is answered from one read). Each runs alone: a finished job's history gains
        nothing until someone requeues it, and one transaction would add two round trips."""
        found: dict[uuid.UUID, tuple[Job, list[dict], list[dict]]] = {}
        if not job_ids:
            return found
        for row in self._run("get_jobs", {"ids": _uuid_array(job_ids)}):
            job = Job.from_row(row)
            if job.status.terminal:
                found[job.id] = (job, [], [])
        if found:
            ids = {"ids": _uuid_array(list(found))}
            for r in self._run("get_events_of", ids):
                found[r.job_id][1].append(_without_job_id(r))
            for r in self._run("get_leases_of", ids):
                found[r.job_id][2].append(_without_job_id(r))
        return found

    def events_after(self, after: int, limit: int) -> list[dict]:
        """The first `limit` history entries above id `after`, oldest first (the event stream)."""
        return [dict(r._mapping) for r in self._run("events_after",
                                                    {"after": after, "limit": limit})]

    def newest_events_after(self, after: int, upto: int, limit: int) -> list[dict]:
        """The newest `limit` history entries with an id in (after, upto], oldest first."""
        rows = self._run("newest_events_after", {"after": after, "upto": upto, "limit": limit})
        return [dict(r._mapping) for r in reversed(rows)]

    def last_event_id(self) -> int:
        return int(self._run("last_event_id", {})[0].id)

    def transaction_horizon(self) -> tuple[int, int]:
        """(oldest running, next) transaction ids: once oldest >= an earlier `next`, every
        transaction that was running when that `next` was read has ended."""
        row = self._run("transaction_horizon", {})[0]
        return int(row.oldest), int(row.next)

    def list_jobs(self, *, status: str | None, type: str | None, queue: str | None,
                  after: tuple[datetime, uuid.UUID] | None, limit: int,
                  tag: str | None = None) -> list[Job]:
        params = {"status": status, "type": type, "queue": queue, "limit": limit, "tag": tag,
                  "after_created": after[0] if after else None,
                  "after_id": after[1] if after else None}
        return [Job.from_row(r) for r in self._run("list_jobs", params)]

    def _move_job(self, name: str, move: Move, job_id: uuid.UUID,
                  actor: str | None) -> Job | None:
        """Run a one-job move found by primary key, fenced on the move's source states; its
        event names `actor` (who asked)."""
        rows = self._run(name, {"id": job_id, "actor": actor, **_move_params(move)})
        return Job.from_row(rows[0]) if rows else None

    def cancel_pending_job(self, job_id: uuid.UUID, actor: str | None = None) -> Job | None:
        return self._move_job("cancel_pending_job", transitions.CANCEL, job_id, actor)

    def cancel_running_job(self, job_id: uuid.UUID, actor: str | None = None) -> Job | None:
        return self._move_job("cancel_running_job", transitions.REQUEST_CANCEL, job_id, actor)

    def requeue_dead_job(self, job_id: uuid.UUID, actor: str | None = None) -> Job | None:
        return self._move_job("requeue_dead_job", transitions.REQUEUE, job_id, actor)

    def fire_slot(self, schedule: ScheduleRow, slot: datetime,
                  conn: Connection | None = None) -> Job | None:
        """Enqueue the job of `schedule`'s `slot` with the slot's record, in one statement;
        None when the slot already fired (or the schedule changed, paused or went)."""
        job = schedule.job
        unique = job.get("unique")
        params = {"name": schedule.name, "revision": schedule.revision, "slot": slot,
                  "id": new_job_id(), "type": job["type"], "queue": job["queue"],
                  "payload": _json(job["payload"]), "priority": job["priority"],
                  "max_retries": job["max_retries"], "timeout_s": job["timeout_s"],
                  "limit_key": job.get("limit_key"),
                  "unique_key": None if unique is None else unique["key"],
                  "status": transitions.ENQUEUE.target.value,
                  "event": transitions.ENQUEUE.event.value}
        rows = self._refusing(self._run("fire_slot", params | {"max_queues": self.max_queues},
                                        conn))
        return Job.from_row(rows[0]) if rows else None

    def fire_unique_slot(self, schedule: ScheduleRow, slot: datetime
                         ) -> tuple[Job | None, bool]:
        """`fire_slot` for a schedule whose job has `unique`, under the key's lock (as every
        unique enqueue, taskline.uniqueness): (the slot's new job, False); or, when a job
        holds the key in scope, (that job, True) with the slot recorded as folded into it
        and nothing written; (None, False) when the slot already fired."""
        job, unique = schedule.job, schedule.job["unique"]
        with self.transaction() as conn:
            self._run("lock_enqueue_keys",
                      {"locks": [unique_lock(job["queue"], unique["key"])]}, conn)
            found = self._run("find_unique", {
                "queue": job["queue"], "unique_key": unique["key"], "states": unique["states"],
                "period_s": unique["period_s"]}, conn)
            if not found:
                return self.fire_slot(schedule, slot, conn), False
            held = Job.from_row(found[0])
            folded = self._run("fold_slot", {"name": schedule.name, "revision": schedule.revision,
                                             "slot": slot, "job_id": held.id}, conn)
            return (held, True) if folded else (None, False)

    # --- worker side ---------------------------------------------------------------------

    def claim_jobs(self, ids: Sequence[uuid.UUID | str], worker_id: str,
                   lease_s: float) -> list[Claimed]:
        """Claim what can be claimed of `ids`; the ids not returned were lost to someone else."""
        rows = self._run_on_driver("claim_jobs", _claim_params(ids, worker_id, lease_s, False))
        return [Claimed(Job.from_row(r), r.lease_id, r.leased_until) for r in rows]

    def claim_jobs_explained(self, ids: Sequence[str], worker_id: str,
                             lease_s: float) -> tuple[list[Claimed], list]:
        """`claim_jobs`, and `claim_refusals` of the same ids right after it, in one round trip
        (a pipeline of two autocommit statements: the second sees the first committed, so it
        explains exactly the ids the claim did not take). For a worker whose last claim was
        refused ids (keyed or paused jobs arrive): the explanation would cost a round trip of
        its own."""
        with self._driver() as driver:
            driver.autocommit = True
            with driver.cursor(row_factory=namedtuple_row) as claim, \
                    driver.cursor(row_factory=namedtuple_row) as refusals:
                with driver.pipeline():
                    claim.execute(driver_sql("claim_jobs", self.schema),
                                  _claim_params(ids, worker_id, lease_s, False),
                                  prepare=self._prepare)
                    refusals.execute(driver_sql("claim_refusals", self.schema),
                                     {"ids": _uuid_array(ids)}, prepare=self._prepare)
                won, refused = claim.fetchall(), refusals.fetchall()
            driver.autocommit = False
        return [Claimed(Job.from_row(r), r.lease_id, r.leased_until) for r in won], refused

    def claim_due_jobs(self, queues: Sequence[str], limit: int, worker_id: str,
                       lease_s: float) -> list[Claimed]:
        """Claim up to `limit` queued jobs PostgreSQL chooses: queues in the order given, most
        urgent first and FIFO within a priority inside each (Redis's order when it is up).

        One transaction: `due_queued_ids` locks the candidates (skipping rows another claimer
        holds), then `claim_jobs` claims them exactly as it claims ids fetched from Redis (same
        rule, lease, event and attempt count), so both paths share one claim. The winners come
        back in candidate order.
        """
        with self._driver_transaction() as run:
            ids: list[str] = []
            for queue in queues:
                if len(ids) >= limit:
                    break
                found = run("due_queued_ids", {"queue": queue, "limit": limit - len(ids)})
                ids += [str(r.id) for r in found]
            if not ids:
                return []
            rows = run("claim_jobs", _claim_params(ids, worker_id, lease_s, False))
        return _claims_in_order(rows, ids)

    def due_queued_locked(self, queues: Sequence[str], limit: int) -> bool:
        """Whether a job `claim_due_jobs` would offer from `queues` (among the `limit` first of
        each) is held by another transaction's row lock now, so that claim skipped it."""
        return any(self._run("due_queued_locked", {"queue": queue, "limit": limit})[0].locked
                   for queue in queues)

    def claim_keyed(self, ids: Sequence[str], worker_id: str,
                    lease_s: float) -> list[Claimed]:
        """Claim those of `ids` (keyed jobs no flow limit applies to, refused by the plain
        claim) that are their key's head now, in the order of `ids`.

        One transaction, as the budgeted claim takes keyed jobs: their keys locked first
        (`lock_ordering_keys`), then `claim_jobs`, the one claim, through the same rule, so two
        claimers of a key never both find it free. This is how a head pushed when its key's
        turn passed (the settle statement's `turns`) starts on the ordinary Redis path.

        Sent in one round trip (a pipeline: BEGIN, the locks, the claim and COMMIT go out
        together and the results come back together). PostgreSQL still runs them one after
        the other, so the claim's snapshot is taken after the locks were granted.
        """
        if not ids:
            return []
        with self._driver() as driver, \
                driver.cursor() as lock, driver.cursor(row_factory=namedtuple_row) as claim:
            with driver.pipeline(), driver.transaction():
                lock.execute(driver_sql("lock_ordering_keys", self.schema),
                             {"ids": _uuid_array(ids)}, prepare=self._prepare)
                claim.execute(driver_sql("claim_jobs", self.schema),
                              _claim_params(ids, worker_id, lease_s, True), prepare=self._prepare)
            rows = claim.fetchall()  # the pipeline's end synced: COMMIT has been answered
        return _claims_in_order(rows, list(ids))

    def keyed_heads_among(self, ids: Sequence[str]) -> set[str]:
        """Of these keyed job ids, those that are their key's head now (the claim rule)."""
        if not ids:
            return set()
        rows = self._run_on_driver("keyed_heads_among", {"ids": _uuid_array(ids)})
        return {str(r.id) for r in rows}

    def turns_after(self, jobs: Sequence[Job]) -> list[Turn]:
        """The turns these jobs, just finished without running (cancelled, lapsed), passed:
        their keys' next heads, to push after the commit. Nothing is read for jobs without an
        ordering key."""
        ids = [j.id for j in jobs if j.ordering_key is not None]
        if not ids:
            return []
        rows = self._run_on_driver("turns_after", {"ids": _uuid_array(ids)})
        return [Turn(r.id, r.queue, int(r.priority)) for r in rows]

    def notify_ready(self, queues: Sequence[str]) -> None:
        """Tell workers dispatching from PostgreSQL that jobs of `queues` became queued."""
        if queues:
            self._run_on_driver("notify_ready", {"queues": sorted(set(queues))})

    def claim_refusals(self, ids: Sequence[uuid.UUID | str]) -> list:
        """Of `ids` a claim did not take, those still queued, each with `paused` and `limited`:
        held, not lost, so they are handed back to Redis (paused) or left to the budgeted claim
        (limited) rather than counted as conflicts."""
        valid = _uuids(ids)
        if not valid:
            return []
        return self._run_on_driver("claim_refusals", {"ids": _uuid_array(valid)})

    def claim_held(self, queues: Sequence[str], slots: int, worker_id: str,
                   lease_s: float) -> HeldClaim:
        """Claim up to `slots` limited jobs of `queues` within every limit's budget.

        One transaction: the limits' rows are locked first (in scope order), so the use read
        next includes every start committed before, and no other budgeted claim can take the
        same budget until this one commits. The rate window's log is written in it too.
        """
        # Straight through psycopg, as the other claims: it runs whenever a limited job ends,
        # and SQLAlchemy's execution layer would cost the worker more CPU than the statements.
        with self._driver_transaction() as run:
            rows = run("lock_flow_limits", {})
            limits = {r.scope: flow.Limit.from_row(r) for r in rows}
            # Without limits only keyed jobs wait here (their key's head starts unbudgeted).
            now = rows[0].now if rows else run("database_now", {})[0].now
            usage = _usage(run("flow_usage", {})) if rows else flow.Usage({}, {}, {})
            picked, held, frees_at = self._admit(run, queues, slots, limits, usage, now)
            # Keyed jobs behind a head wait without a refusal to announce them: a dead or
            # cancelled head gives them the turn in PostgreSQL alone.
            held = held or run("keyed_waiting", {"queues": list(queues),
                                                 "skip": _uuid_array(picked)})[0].waiting
            claimed = self._claim_picked(run, picked, worker_id, lease_s, limits)
        return HeldClaim(claimed, held=held, frees_at=frees_at, now=now)

    @staticmethod
    def _admit(run: Callable[[str, dict[str, Any]], list], queues: Sequence[str], slots: int,
               limits: dict[str, flow.Limit], usage: flow.Usage,
               now: datetime) -> tuple[list[str], bool, datetime | None]:
        """Held jobs to start within budget: (ids, whether others remain, when a rate frees).

        Candidates are read a window at a time, skipping budgets already spent; a round that
        spends a budget reads again without its jobs, so one tenant's long backlog ahead in
        the queue cannot hide another tenant's jobs from the claim (at most ADMIT_ROUNDS).
        """
        picked: list[str] = []
        window = max(4 * slots, 32)
        admission = None
        # Without limits only keyed jobs are held: read them alone, through their own index.
        candidates = "held_candidates" if limits else "keyed_heads"
        for _ in range(ADMIT_ROUNDS):
            full = flow.full_budgets(limits.values(), usage.running, usage.started)
            found = [flow.Candidate(str(r.id), r.type, r.queue, r.limit_key) for r in run(
                candidates, {"queues": list(queues), "limit": window, "skip": picked,
                             **_full_params(limits, full)})]
            admission = flow.admit(found, limits, usage, slots - len(picked), now)
            picked += admission.picked
            usage = admission.usage
            if len(found) < window or not admission.picked or len(picked) >= slots:
                # Jobs of a spent budget were left out of `found`: they may still wait.
                held = len(found) > len(admission.picked) or bool(admission.full)
                return picked, held, admission.frees_at
        return picked, True, admission.frees_at if admission else None

    @staticmethod
    def _claim_picked(run: Callable[[str, dict[str, Any]], list], ids: list[str],
                      worker_id: str, lease_s: float,
                      limits: dict[str, flow.Limit]) -> list[Claimed]:
        if not ids:
            return []
        run("lock_ordering_keys", {"ids": _uuid_array(ids)})
        rows = run("claim_jobs", _claim_params(ids, worker_id, lease_s, True))
        starts = [{"scope": lim.scope, "key": lim.key_of(r.limit_key),
                   "at": r.leased_at.isoformat()}
                  for r in rows for scope in flow.scopes_of(r.type, r.queue)
                  if (lim := limits.get(scope)) is not None and lim.rate_limit is not None]
        if starts:
            run("record_flow_starts", {"starts": _json(starts)})
        return _claims_in_order(rows, ids)

    # --- flow limits ---------------------------------------------------------------------

    def put_flow_limit(self, limit: flow.Limit, conn: Connection | None = None) -> dict:
        """Create or replace a scope's limits; the row, with `created`."""
        rows = self._run("upsert_flow_limit", {
            "scope": limit.scope, "concurrency": limit.concurrency,
            "rate_limit": limit.rate_limit, "period_s": limit.period_s,
            "per_key": limit.per_key}, conn)
        return dict(rows[0]._mapping)

    def delete_flow_limit(self, scope: str, conn: Connection | None = None) -> dict | None:
        rows = self._run("delete_flow_limit", {"scope": scope}, conn)
        return dict(rows[0]._mapping) if rows else None

    def list_flow_limits(self) -> list[dict]:
        """Every limit with its use now (running, started in the window) and the jobs it holds."""
        return [dict(r._mapping) for r in self._run("list_flow_limits", {})]

    def lapse_due(self, limit: int) -> tuple[list[Job], list[Job]]:
        """Cancel up to `limit` jobs not started by their expiry (event `lapsed`) and, for
        workflow steps among them, their waiting dependents, in one transaction: (the lapsed
        jobs, the dependents cancelled and the `when` steps queued)."""
        with self.transaction() as conn:
            lapsed = [Job.from_row(r) for r in self._run(
                "lapse_due", {"limit": limit, **_move_params(transitions.LAPSE)}, conn)]
            steps = [j.id for j in lapsed if j.workflow_id is not None]
            if not steps:
                return lapsed, []
            return lapsed, self.cancel_waiting_dependents(steps, None, conn, ended=steps)

    def write_progress(self, lease_id: int, worker_id: str, value: Any) -> bool:
        """Write a running attempt's progress under its lease; False when the lease is gone."""
        rows = self._run_on_driver("write_progress", {
            "lease_id": lease_id, "worker_id": worker_id, "progress": _json(value),
            "sources": transitions.PROGRESS.source_names,
            "event": transitions.PROGRESS.event.value})
        return bool(rows)

    def ordering_key_counts(self) -> list:
        """Per queue: `keys` (ordering keys with unfinished jobs) and their `queued` jobs."""
        return self._run("ordering_key_counts", {})

    def flow_limit_scopes(self) -> set[str]:
        """The scopes that have a limit (workers read this once a second)."""
        return {r.scope for r in self._run("flow_limit_scopes", {})}

    def released_of_scope(self, scope: str, limit: int,
                          after: tuple[int, datetime, uuid.UUID] | None) -> list:
        """One page of the queued jobs `scope` names that no limit holds any more."""
        return self._run("held_of_scope", {
            "scope": scope, "limit": limit,
            "after_priority": after[0] if after else None,
            "after_created": after[1] if after else None,
            "after_id": after[2] if after else None})

    # --- queue pause ---------------------------------------------------------------------

    def pause_queue(self, queue: str, actor: str | None,
                    conn: Connection | None = None) -> dict | None:
        """Pause `queue`; the pause row when this call paused it, None when it already was."""
        rows = self._run("pause_queue", {"queue": queue, "actor": actor}, conn)
        return dict(rows[0]._mapping) if rows else None

    def resume_queue(self, queue: str, conn: Connection | None = None) -> dict | None:
        """Resume `queue`; the removed pause row, or None when it was not paused."""
        rows = self._run("resume_queue", {"queue": queue}, conn)
        return dict(rows[0]._mapping) if rows else None

    def paused_queues(self) -> dict[str, dict]:
        """{queue: {queue, paused_at, actor}} for every paused queue."""
        return {r.queue: dict(r._mapping) for r in self._run("paused_queues", {})}

    def renew_leases(self, lease_ids: Sequence[int], worker_id: str, lease_s: float,
                     ) -> dict[int, bool | None]:
        """Renew leases; returns {lease_id: cancel_requested} for the leases still held, None
        for a lease still held but not renewed because another transaction (its outcome being
        written) holds it locked."""
        if not lease_ids:
            return {}
        rows = self._run("renew_leases", {"lease_ids": list(lease_ids), "worker_id": worker_id,
                                          "lease_s": lease_s, **lease_span(lease_ids)})
        return {r.lease_id: None if r.busy else r.cancel_requested for r in rows}

    def settle(self, settlements: Sequence[Settlement], conn: Connection | None = None, *,
               lapsed: bool = False) -> list[Settled]:
        """End these attempts, each only while its lease is live (the fence); returns the jobs
        settled. Alone it is one autocommit statement; `lapsed` settles only expired leases."""
        if not settlements:
            return []
        params = _settle_params(settlements, lapsed)
        releasing = any(s.releases and s.transition.move.target in _DECIDING
                        for s in settlements)
        name = "settle_releasing" if releasing else "settle"
        if releasing:
            params.update(_continuing("", 0.0, [], 0))
        rows = (self._run(name, params, conn) if conn is not None
                else self._run_on_driver(name, params))
        return _with_releases(rows)[0] if releasing else [Settled.from_row(r) for r in rows]

    def settle_succeeded(self, successes: Sequence[tuple[int, Any]],
                         worker_id: str) -> list[Settled]:
        """`settle` for plain successes of `worker_id`'s attempts, given as (lease id, result):
        jobs that are no workflow step and have no ordering key. One autocommit statement,
        `settle_succeeded`, with the same fence and the same effects as `settle` of
        `transitions.succeeded(result)` for each, without a settlement document."""
        if not successes:
            return []
        lease_ids = [lease_id for lease_id, _ in successes]
        results = {str(lease_id): result for lease_id, result in successes
                   if result is not None}
        move = transitions.SUCCEED
        rows = self._run_on_driver("settle_succeeded", {
            **_lease_params(lease_ids), "results": _rows_json(results), "worker_id": worker_id,
            "status": move.target.value, "event": move.event.value,
            "outcome": Outcome.SUCCEEDED.value})
        return [Settled.from_row(r) for r in rows]

    def settle_continuing(self, settlements: Sequence[Settlement], *, worker_id: str,
                          lease_s: float, queues: Sequence[str],
                          most: int) -> tuple[list[Settled], list[Claimed]]:
        """`settle` for successes of workflow steps that also claims, for `worker_id`, up to
        `most` of the steps they release: those of `queues` first in line, most urgent first.

        One autocommit statement, `settle_releasing` (the claim rule's gates applied to the
        steps it releases: a paused or limited step is not started and stays queued, to be
        pushed as usual), so a released step starts on the worker that released it after one
        round trip and one commit instead of two of each (the release's, then a claim's after
        a push and a fetch). Returns the settled rows, whose `released` lists the steps queued
        but not started, and the claims, most urgent first.
        """
        params = {**_settle_params(settlements, False),
                  **_continuing(worker_id, lease_s, queues, most)}
        return _with_releases(self._run_on_driver("settle_releasing", params))

    def settle_turning(self, settlements: Sequence[Settlement], *, worker_id: str,
                       lease_s: float, queues: Sequence[str],
                       most: int) -> tuple[list[Settled], list[Claimed]]:
        """`settle` for successes holding keyed jobs that also starts, for `worker_id`, up to
        `most` of the turns they pass: each finished head's next job in line, when queued and
        of `queues`, most urgent first.

        One autocommit statement, `settle_turning` (the claim rule's gates applied to the
        turns; the head test holds by construction, see the statement), so a key's next job
        starts on the worker that finished its head after one round trip, instead of a push,
        a fetch and two claim round trips. Returns the settled rows, whose `turn` is left only
        for a turn not started here (pushed as usual), and the claims."""
        params = {**_settle_params(settlements, False), **_CLAIM, "worker_id": worker_id,
                  "lease_s": lease_s, "served": list(queues), "most": max(most, 0)}
        return _with_releases(self._run_on_driver("settle_turning", params))

    def settle_with_hooks(self, settlement: Settlement,
                          hooks: Sequence[Callable[[Connection], None]]) -> list[Settled]:
        """Settle one attempt and run `hooks` in the same transaction; both or neither commit.
        Returns the settled row (with the steps it released), empty when nothing was settled."""
        with self.transaction() as conn:
            settled = self.settle([settlement], conn)
            if not settled:
                return []
            for hook in hooks:
                hook(conn)
        return settled

    # --- maintenance side ----------------------------------------------------------------

    def skip_backoff(self) -> None:
        """Make every retrying job due now (taskline.testing.drain: a test waits for no
        backoff)."""
        self._run("testing_skip_backoff", {})

    def schema_tables(self) -> list[str]:
        """The installation's tables but its migration version table."""
        return [r.tablename for r in self._run("testing_tables", {"schema": self.schema})]

    def promote_due(self, limit: int) -> list[Promoted]:
        rows = self._run("promote_due", {"limit": limit, **_move_params(transitions.PROMOTE)})
        return [Promoted.from_row(r) for r in rows]

    def recover_expired(self, limit: int) -> list[Recovered]:
        """Settle up to `limit` expired leases by the lifecycle's recovery rule, in one
        transaction (the jobs stay locked from the read to the write)."""
        with self.transaction() as conn:
            expired = [Expired.from_row(r) for r in self._run("expired_leases", {"limit": limit},
                                                              conn)]
            decided = {e.lease_id: (e, e.settlement()) for e in expired}
            settled = self.settle([s for _e, s in decided.values()], conn, lapsed=True)
        return [Recovered(decided[r.lease_id][0], decided[r.lease_id][1].transition, r)
                for r in settled]

    def outbox_page(self, limit: int) -> list[Owed]:
        """The oldest `limit` jobs enqueued in an application's transaction and owed to Redis."""
        return [Owed.from_row(r) for r in self._run_on_driver("outbox_page", {"limit": limit})]

    def delete_outbox(self, ids: Sequence[uuid.UUID | str]) -> None:
        """Forget these outbox rows (after their ids reached Redis)."""
        if ids:
            self._run_on_driver("delete_outbox", {"ids": _uuid_array(ids)})

    def expire_finished(self, status: Status, retain_s: float, limit: int) -> list[Deleted]:
        """Delete up to `limit` jobs finished in `status` more than `retain_s` seconds ago
        (PostgreSQL time), each whole (events, leases, DLQ row) in one statement."""
        if not transitions.expirable(status) or retain_s <= 0:
            raise ValueError(f"retention cannot delete {status} jobs after {retain_s} s")
        rows = self._run("expire_finished", {"status": status.value, "retain_s": retain_s,
                                             "limit": limit})
        return [Deleted.from_row(r) for r in rows]

    def oldest_finished(self, statuses: Sequence[Status]) -> dict[Status, float | None]:
        """Seconds since the oldest kept job of each status finished; None when none is kept."""
        rows = self._run("oldest_finished", {"statuses": [s.value for s in statuses]})
        return {Status(r.status): None if r.age_s is None else float(r.age_s) for r in rows}

    def seconds_to_next_lease_expiry(self) -> float | None:
        """Seconds until the earliest open lease of a running job ends, in PostgreSQL time
        (negative when one already has); None when no job is running."""
        return self._run("next_lease_expiry", {})[0].seconds

    def pending_page(self, after: uuid.UUID, before: datetime, limit: int) -> list:
        return self._run("pending_page", {"after": after, "before": before, "limit": limit})

    def dead_page(self, after: uuid.UUID, before: datetime, limit: int) -> list:
        return self._run("dead_page", {"after": after, "before": before, "limit": limit})

    def statuses(self, ids: Sequence[str]) -> dict[str, Any]:
        """{id: row} for the ids that exist; absent ids (and non-UUIDs) are missing from it."""
        valid = _uuids(ids)
        if not valid:
            return {}
        return {str(r.id): r for r in self._run("statuses", {"ids": valid})}

    def pending_queues(self) -> list[str]:
        return [r.queue for r in self._run("pending_queues", {})]

    def queue_counts(self) -> list:
        return self._run("queue_counts", {})

    def oldest_ready(self) -> dict[str, float]:
        return {r.queue: float(r.age_s) for r in self._run("oldest_ready", {})}

    def now(self) -> datetime:
        """PostgreSQL's clock: the only clock that decides leases and due times."""
        with self.transaction() as conn:
            return conn.exec_driver_sql("SELECT now()").scalar_one()

    def ping(self) -> None:
        self._run("ping", {})

    def outbox_backlog(self) -> tuple[int, float]:
        """(outbox rows not relayed yet, the oldest one's age in seconds; 0 when none)."""
        row = self._run("outbox_backlog", {})[0]
        return int(row.n), float(row.oldest_s)


@dataclass(frozen=True)
class HeldClaim:
    """What a budgeted claim started, whether held jobs remain, and when a rate budget frees."""

    claimed: list[Claimed]
    held: bool
    frees_at: datetime | None
    now: datetime | None
    """PostgreSQL's clock when the budgets were judged (None: no limit exists)."""

    def frees_in_s(self) -> float | None:
        """Seconds until a full rate budget has room again, if one is the bound."""
        if self.frees_at is None or self.now is None:
            return None
        return max((self.frees_at - self.now).total_seconds(), 0.0)


def _usage(rows: Sequence[Any]) -> flow.Usage:
    running = {(r.scope, r.key): int(r.n) for r in rows if r.kind == "running"}
    started = {(r.scope, r.key): int(r.n) for r in rows if r.kind == "started"}
    oldest = {(r.scope, r.key): r.oldest for r in rows if r.kind == "started"}
    return flow.Usage(running, started, oldest)


def _full_params(limits: dict[str, flow.Limit], full: Sequence[flow.Budget]) -> dict[str, list]:
    """The held_candidates filters: scopes with no budget at all, and per-key budgets spent."""
    scopes = [scope for scope, key in full if not limits[scope].per_key]
    keys = [f"{scope}\x1f{key}" for scope, key in full if limits[scope].per_key]
    return {"full_scopes": scopes, "full_keys": keys}


ADMIT_ROUNDS = 4
"""Most candidate windows one budgeted claim reads (see Store._admit)."""


def _claim_params(ids: Sequence[uuid.UUID | str], worker_id: str, lease_s: float,
                  limited: bool) -> dict[str, Any]:
    """claim_jobs' parameters: `limited` true only inside a transaction holding the locks it
    needs: the budgeted claim's (Store.claim_held), or the keys' of keyed jobs (claim_keyed)."""
    return {"ids": _uuid_array(ids), "worker_id": worker_id, "lease_s": lease_s,
            "limited": limited, **_CLAIM}


def _claims_in_order(rows: Sequence[Any], ids: Sequence[str]) -> list[Claimed]:
    """claim_jobs' rows as claims, in the order of `ids` (the statement returns any order)."""
    order = {job_id: n for n, job_id in enumerate(ids)}
    return sorted((Claimed(Job.from_row(r), r.lease_id, r.leased_until) for r in rows),
                  key=lambda c: order[str(c.job.id)])


def _settle_params(settlements: Sequence[Settlement], lapsed: bool) -> dict[str, Any]:
    return {"settlements": _rows_json({str(s.lease_id): s.to_input(lapsed=lapsed)
                                       for s in settlements}),
            **_lease_params([s.lease_id for s in settlements])}


def _lease_params(lease_ids: Sequence[int]) -> dict[str, Any]:
    """The lease ids of a statement that ends attempts (an array literal) and their bounds
    (lease_span)."""
    return {"lease_ids": "{" + ",".join(map(str, lease_ids)) + "}", **lease_span(lease_ids)}


def lease_span(lease_ids: Sequence[int]) -> dict[str, int]:
    """The lowest and highest of `lease_ids`: a lease statement's bounds on the partition key,
    which a generic plan prunes the history partitions by (an id array cannot prune them)."""
    return {"lease_min": min(lease_ids), "lease_max": max(lease_ids)}


def _with_releases(rows: Sequence[Any]) -> tuple[list[Settled], list[Claimed]]:
    """settle_releasing's rows: the settlements, the steps queued carried by the last, and the
    steps started, most urgent first (release order, the id, within a priority)."""
    settled = [Settled.from_row(r) for r in rows if r.kind == "settled"]
    released = tuple(Released.from_row(r) for r in rows if r.kind == "released")
    unmet = sum(1 for r in rows if r.kind == "unmet")
    started = sorted((r for r in rows if r.kind == "started"), key=lambda r: (-r.priority, r.id))
    claims = [Claimed(Job.from_row(r), r.lease_id, r.leased_until) for r in started]
    if (released or unmet) and settled:
        settled[-1] = dataclasses.replace(settled[-1], released=released, unmet=unmet)
    return settled, claims


def _continuing(worker_id: str, lease_s: float, queues: Sequence[str],
                most: int) -> dict[str, Any]:
    """settle_releasing's parameters beyond settle's: release, and start up to `most` of the
    steps released for `worker_id` (none when 0)."""
    return {**_RELEASE, **_CLAIM, "worker_id": worker_id, "lease_s": lease_s,
            "served": list(queues), "most": max(most, 0)}


_CLAIM = {"target": transitions.CLAIM.target.value, "event": transitions.CLAIM.event.value}
_RELEASE = {"release_sources": transitions.UNBLOCK.source_names,
            "release_target": transitions.UNBLOCK.target.value,
            "release_event": transitions.UNBLOCK.event.value,
            "unmet_target": transitions.CANCEL.target.value,
            "unmet_event": transitions.CANCEL.event.value, "unmet_cause": CONDITION_UNMET}
_DECIDING = frozenset({Status.SUCCEEDED, Status.DEAD, Status.CANCELLED})
"""The ends of an attempt a workflow step's dependents count: success releases every kind of
dependent, dead and cancelled the `when` ones (taskline.workflows)."""

_UNAVAILABLE = (exc.OperationalError, exc.InterfaceError, exc.TimeoutError)
_DRIVER_UNAVAILABLE = (psycopg.OperationalError, psycopg.InterfaceError)


STATEMENT_ERRORS: tuple[type[Exception], ...] = (psycopg.Error, exc.DBAPIError)
"""What a statement raises when PostgreSQL refuses what it was given (outages are
StoreUnavailable): the error may concern one row of a multi-row statement."""


@contextlib.contextmanager
def translate_errors() -> Iterator[None]:
    """Turn "cannot reach PostgreSQL" driver errors into StoreUnavailable."""
    try:
        yield
    except exc.DBAPIError as err:
        if isinstance(err, _UNAVAILABLE) or err.connection_invalidated:
            raise StoreUnavailable(f"PostgreSQL unavailable: {type(err.orig).__name__}") from err
        raise
    except exc.TimeoutError as err:
        raise StoreUnavailable("PostgreSQL connection pool exhausted") from err


@contextlib.contextmanager
def translate_driver_errors(driver: psycopg.Connection | None) -> Iterator[None]:
    """translate_errors for psycopg's own errors, where SQLAlchemy is bypassed: unreachable,
    any error that left `driver` broken, or an outdated plan (see outdated_plan) becomes
    StoreUnavailable."""
    try:
        yield
    except psycopg.Error as err:
        if isinstance(err, _DRIVER_UNAVAILABLE) or (driver is not None and driver.broken):
            raise StoreUnavailable(f"PostgreSQL unavailable: {type(err).__name__}") from err
        if outdated_plan(err):
            raise StoreUnavailable("PostgreSQL changed its schema under a prepared statement; "
                                   "retry on a new connection") from err
        raise
