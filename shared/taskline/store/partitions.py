"""The partitions of the history tables (`job_events`, `job_leases`; migration 0021): created
ahead, rolled daily, and replaced or dropped by retention instead of deleting rows.

Both tables are partitioned by RANGE (id), `WIDTH` ids a partition (`<table>_p<k>` holds ids
k*WIDTH .. (k+1)*WIDTH - 1), plus `<table>_legacy` (the table as it was before 0021) and
`<table>_default` (rows no range takes; empty unless maintenance stopped creating partitions
ahead). Ids come from each table's sequence, so partitions fill in time order; once the
partition the sequence is in got its first row more than `roll_s` ago, `roll` moves the
sequence to the next partition's first id, so a partition is about a day of history.

Invariants:
- A partition is only ever created for a range the sequence has not reached, and the sequence
  only ever moves forward (`roll` refuses unless it is well inside the current partition, under
  an advisory lock), so an id is never given twice: the primary key `(id)` is global.
- Retention never loses a row whose job exists. `expire` takes a closed partition (the sequence
  is past it) whose newest row is older than the horizon, copies the rows whose job still
  exists (a dead job kept 30 days, an unfinished job) into a new table, then in one short
  transaction under `LOCK_TIMEOUT` detaches and drops the old partition and attaches the copy
  with the same bounds. Rows of a closed partition never change (events are never updated;
  a lease is updated only while live, and a partition holding a live lease is left for a later
  pass), so the copy is exact; a job deleted meanwhile leaves an orphan row in the copy, taken
  by a later pass.
- Rows whose job is gone are garbage: nothing reads events or leases except through their job.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import OperationalError

log = logging.getLogger(__name__)

WIDTH = 1_000_000_000
"""Ids per partition: far more than a day of events at 100 million jobs a day (about 4e8), so
partitions end by `roll`, not by filling up; a bigint holds 9e9 of them."""
TABLES = {"job_events": "created_at", "job_leases": "leased_at"}
"""Each partitioned history table and the column that says when its row was written."""
LOCK_TIMEOUT = "200ms"
"""How long the swap waits for its locks before giving up until the next pass: every insert
into the table waits behind it meanwhile."""
ROLL_MARGIN = 1_000_000
"""`roll` moves the sequence only while it is this far from the partition's end."""
ROLL_LOCK = 29805
"""Advisory lock key of `roll` (29804 is the ordering keys')."""
STORAGE = ("autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_insert_scale_factor = 0.05, "
           "autovacuum_analyze_scale_factor = 0.02, vacuum_truncate = false")
"""The history tables' storage parameters (migrations 0011, 0013), set on each partition."""
ANALYZE_AFTER = 1_000
"""Rows a new partition takes before maintenance analyzes it (`analyze_new`): enough for its
statistics to show what the table holds (ended leases, few open ones)."""
_BOUND = re.compile(r"FROM \((MINVALUE|'?-?\d+'?)\) TO \('?(-?\d+)'?\)")


@dataclass(frozen=True)
class Partition:
    """One partition: ids lower .. upper - 1 (lower None: MINVALUE; both None: the default)."""

    table: str
    name: str
    lower: int | None
    upper: int | None

    @property
    def default(self) -> bool:
        return self.upper is None


@dataclass(frozen=True)
class TableState:
    """What the doctor and the metrics read of one table's partitions."""

    table: str
    next_id: int
    ahead: int
    """Partitions ready past the one the sequence is in."""
    default_rows: bool
    partitions: int


def _bounds(expr: str) -> tuple[int | None, int | None]:
    match = _BOUND.search(expr)
    if expr.strip() == "DEFAULT" or not match:
        return None, None
    lower = None if match.group(1) == "MINVALUE" else int(match.group(1).strip("'"))
    return lower, int(match.group(2))


class HistoryPartitions:
    """Partition upkeep of one installation (its schema)."""

    def __init__(self, engine: Engine, schema: str) -> None:
        self.engine = engine
        self.schema = schema

    def _q(self, name: str) -> str:
        return f'"{self.schema}"."{name}"'

    def list(self, conn: Connection, table: str) -> list[Partition]:
        rows = conn.exec_driver_sql(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(%(t)s)",
            {"t": self._q(table)}).all()
        parts = [Partition(table, name, *_bounds(expr)) for name, expr in rows]
        return sorted(parts, key=lambda p: (p.upper is None, p.upper or 0))

    def next_id(self, conn: Connection, table: str) -> int:
        """The id the table's next insert takes (give or take those in flight)."""
        seq = conn.exec_driver_sql(f"SELECT pg_get_serial_sequence('{self._q(table)}', 'id')"
                                   ).scalar()
        last, called = conn.exec_driver_sql(f"SELECT last_value, is_called FROM {seq}").one()
        return int(last) + (1 if called else 0)

    def state(self) -> list[TableState]:
        with self.engine.connect() as conn:
            out = []
            for table in TABLES:
                parts = self.list(conn, table)
                nxt = self.next_id(conn, table)
                ahead = sum(1 for p in parts if p.lower is not None and p.lower > nxt)
                default = next((p for p in parts if p.default), None)
                rows = bool(default and conn.exec_driver_sql(
                    f"SELECT EXISTS (SELECT 1 FROM {self._q(default.name)})").scalar())
                out.append(TableState(table, nxt, ahead, rows, len(parts)))
            return out

    def ensure_ahead(self, ahead: int) -> list[str]:
        """Create the missing partitions of the one the sequence is in and `ahead` past it;
        returns their names. Each is created alone and attached (SHARE UPDATE EXCLUSIVE on the
        table: inserts go on), empty, so the attach reads nothing but the default partition."""
        created = []
        for table in TABLES:
            with self.engine.connect() as conn:
                parts = self.list(conn, table)
                first = self.next_id(conn, table) // WIDTH
                default_max = self._default_max(conn, parts)
            for k in range(first, first + ahead + 1):
                lower, upper = k * WIDTH, (k + 1) * WIDTH
                if any(_overlaps(p, lower, upper) for p in parts) or default_max >= lower:
                    continue
                self._create(table, k)
                created.append(f"{table}_p{k}")
        return created

    def _default_max(self, conn: Connection, parts: list[Partition]) -> int:
        default = next((p for p in parts if p.default), None)
        if default is None:
            return -1
        top = conn.exec_driver_sql(f"SELECT max(id) FROM {self._q(default.name)}").scalar()
        return -1 if top is None else int(top)

    def _create(self, table: str, k: int) -> None:
        name = self._q(f"{table}_p{k}")
        with self.engine.begin() as conn:
            conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
            conn.exec_driver_sql(f"CREATE TABLE IF NOT EXISTS {name} (LIKE {self._q(table)} "
                                 f"INCLUDING DEFAULTS) WITH ({STORAGE})")
            conn.exec_driver_sql(f"ALTER TABLE {self._q(table)} ATTACH PARTITION {name} "
                                 f"FOR VALUES FROM ({k * WIDTH}) TO ({(k + 1) * WIDTH})")
        log.info("history partition created", extra={"action": "partition_created",
                                                     "partition": f"{table}_p{k}"})

    def _current(self, conn: Connection, table: str) -> tuple[int, Partition | None]:
        """The id `table`'s next insert takes, and the range partition holding it (None while
        maintenance has not created it yet: rows go to the default partition)."""
        nxt = self.next_id(conn, table)
        lower = nxt // WIDTH * WIDTH
        return nxt, next((p for p in self.list(conn, table)
                          if p.lower == lower and p.upper == lower + WIDTH), None)

    def roll(self, every_s: float) -> list[str]:
        """Move each sequence to the next partition once its current one got its first row
        more than `every_s` ago; returns the tables rolled."""
        rolled = []
        for table, at in TABLES.items():
            with self.engine.begin() as conn:
                conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({ROLL_LOCK})")
                nxt, part = self._current(conn, table)
                upper = (nxt // WIDTH + 1) * WIDTH
                if part is None or upper - nxt < ROLL_MARGIN:
                    continue
                opened = conn.exec_driver_sql(
                    f"SELECT {at} < now() - make_interval(secs => %(s)s) FROM "
                    f"{self._q(part.name)} ORDER BY id LIMIT 1", {"s": every_s}).scalar()
                if not opened:
                    continue
                seq = conn.exec_driver_sql(
                    f"SELECT pg_get_serial_sequence('{self._q(table)}', 'id')").scalar()
                conn.exec_driver_sql(f"SELECT setval('{seq}', {upper}, false)")
                rolled.append(table)
        return rolled

    def analyze_new(self) -> list[str]:
        """ANALYZE each table's current partition (the one the sequence is in) once it holds
        `ANALYZE_AFTER` rows if it was never analyzed; returns the partitions analyzed.

        Without statistics the planner guesses. This release's settle and renewal read their
        leases by primary key whatever the statistics (`live_leases_by_id`, migration 0027); a
        release before it, running beside it through a rolling deploy, reads them through
        `live_leases`, and its generic plans then also read the whole open-lease index
        (`job_leases_open`, every lease ended since the last vacuum still in it), a settle
        taking 1.5x - 5x as long (docs/performance.md, changes 106 and 126); other plans over
        the partition are guesses too. Autovacuum analyzes a new partition within its naptime
        after 50 rows; this covers the time before, and an installation running without
        autovacuum, for which it is the partition's only analysis (`taskline doctor` warns
        about that setting). A lock not had within `LOCK_TIMEOUT` (autovacuum at work on
        it) leaves it to the next pass."""
        analyzed = []
        for table in TABLES:
            with self.engine.connect() as conn:
                nxt, part = self._current(conn, table)
                if part is None or nxt % WIDTH < ANALYZE_AFTER or conn.exec_driver_sql(
                        "SELECT reltuples >= 0 FROM pg_class WHERE oid = to_regclass(%(t)s)",
                        {"t": self._q(part.name)}).scalar():
                    continue
            try:
                with self.engine.begin() as conn:
                    conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
                    conn.exec_driver_sql(f"ANALYZE {self._q(part.name)}")
            except OperationalError as err:
                log.warning("history partition left unanalyzed for the next pass", extra={
                    "action": "partition_analyzed", "partition": part.name,
                    "error": str(err).splitlines()[0]})
                continue
            log.info("history partition analyzed", extra={"action": "partition_analyzed",
                                                          "partition": part.name})
            analyzed.append(part.name)
        return analyzed

    def expirable(self, horizon_s: float) -> list[Partition]:
        """Closed partitions (the sequence is past them) whose newest row is older than
        `horizon_s`, oldest first."""
        out = []
        with self.engine.connect() as conn:
            for table, at in TABLES.items():
                nxt = self.next_id(conn, table)
                for part in self.list(conn, table):
                    if part.default or part.upper is None or part.upper > nxt:
                        continue
                    old = conn.exec_driver_sql(
                        f"SELECT COALESCE((SELECT {at} < now() - make_interval(secs => %(s)s) "
                        f"FROM {self._q(part.name)} ORDER BY id DESC LIMIT 1), true)",
                        {"s": horizon_s}).scalar()
                    if old:
                        out.append(part)
        return out

    def expire(self, part: Partition) -> int | None:
        """Replace `part` by a copy of its rows whose job still exists, or drop it when none
        does; returns the rows kept, or None when it was left (a live lease, a lock held)."""
        source, copy = self._q(part.name), self._q(f"{part.name}_k")
        with self.engine.begin() as conn:
            if part.table == "job_leases" and self._holds_live_lease(conn, source):
                return None
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {copy}")
            conn.exec_driver_sql(f"CREATE TABLE {copy} (LIKE {self._q(part.table)} "
                                 f"INCLUDING DEFAULTS) WITH ({STORAGE})")
            kept = conn.exec_driver_sql(
                f"INSERT INTO {copy} SELECT * FROM {source} r WHERE EXISTS "
                f"(SELECT 1 FROM {self._q('jobs')} j WHERE j.id = r.job_id) ORDER BY id"
            ).rowcount
        try:
            with self.engine.begin() as conn:
                self._swap(conn, part, kept)
        except Exception as err:  # a lock not had in time: the next pass tries again
            log.warning("history partition left for the next pass",
                        extra={"action": "partition_kept", "partition": part.name,
                               "error": str(err).splitlines()[0]})
            with self.engine.begin() as conn:
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {copy}")
            return None
        log.info("history partition expired", extra={
            "action": "partition_dropped" if not kept else "partition_compacted",
            "partition": part.name, "kept": kept})
        return kept

    def _holds_live_lease(self, conn: Connection, source: str) -> bool:
        return bool(conn.exec_driver_sql(
            f"SELECT EXISTS (SELECT 1 FROM {source} l WHERE l.released_at IS NULL AND EXISTS "
            f"(SELECT 1 FROM {self._q('jobs')} j WHERE j.id = l.job_id "
            f"AND j.status = 'running' AND j.attempts = l.attempt))").scalar())

    def _swap(self, conn: Connection, part: Partition, kept: int) -> None:
        """Detach and drop `part`; attach its copy in its place when it kept rows. The copy's
        indexes are built before the lock (ATTACH then adopts them), and its CHECK proves the
        bounds, so the lock is held for catalog changes only."""
        source, copy = self._q(part.name), self._q(f"{part.name}_k")
        lower = "MINVALUE" if part.lower is None else str(part.lower)
        if kept:
            check = (f"id < {part.upper}" if part.lower is None
                     else f"id >= {part.lower} AND id < {part.upper}")
            conn.exec_driver_sql(f"ALTER TABLE {copy} ADD CHECK ({check})")
            conn.exec_driver_sql(f"ALTER TABLE {copy} ADD PRIMARY KEY (id)")
            for columns, where in _INDEXES[part.table]:
                conn.exec_driver_sql(f"CREATE INDEX ON {copy} {columns}{where}")
        conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        if part.table == "job_leases" and self._holds_live_lease(conn, source):
            raise RuntimeError("a lease of the partition became live")
        conn.exec_driver_sql(f"ALTER TABLE {self._q(part.table)} DETACH PARTITION {source}")
        conn.exec_driver_sql(f"DROP TABLE {source}")
        if kept:
            conn.exec_driver_sql(f'ALTER TABLE {copy} RENAME TO "{part.name}"')
            conn.exec_driver_sql(f"ALTER TABLE {self._q(part.table)} ATTACH PARTITION "
                                 f"{source} FOR VALUES FROM ({lower}) TO ({part.upper})")
        else:
            conn.exec_driver_sql(f"DROP TABLE {copy}")

    def prune_default(self, limit: int) -> int:
        """Delete up to `limit` rows of the default partitions whose job is gone: the rows no
        partition drop covers. Returns the rows deleted."""
        deleted = 0
        with self.engine.begin() as conn:
            for table in TABLES:
                default = self._q(f"{table}_default")
                deleted += conn.exec_driver_sql(
                    f"DELETE FROM {default} WHERE id IN (SELECT r.id FROM {default} r "
                    f"WHERE NOT EXISTS (SELECT 1 FROM {self._q('jobs')} j WHERE j.id = r.job_id)"
                    f" LIMIT %(n)s)", {"n": limit}).rowcount
        return deleted


_INDEXES: dict[str, list[tuple[str, str]]] = {
    "job_events": [("(job_id, id)", "")],
    "job_leases": [("(job_id, id)", ""), ("(leased_until)", " WHERE released_at IS NULL")],
}
"""The non-unique indexes of each table (the parent's, which ATTACH matches by definition)."""


def _overlaps(part: Partition, lower: int, upper: int) -> bool:
    if part.default:
        return False
    return (part.lower is None or part.lower < upper) and (part.upper or 0) > lower


def horizon_s(retention: dict[str, float]) -> float | None:
    """Age past which a closed partition is expired: the longest window of the statuses most
    jobs end in (succeeded, cancelled), so a partition is replaced when most of its jobs are
    gone and only the longer-kept ones (dead) are copied; None when one of them is kept
    forever (0), where a partition could rarely be emptied."""
    windows = [retention["succeeded"], retention["cancelled"]]
    return None if min(windows) <= 0 else max(windows)


def as_dict(state: TableState) -> dict[str, Any]:
    return {"table": state.table, "next_id": state.next_id, "ahead": state.ahead,
            "default_rows": state.default_rows, "partitions": state.partitions}
