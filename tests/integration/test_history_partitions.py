"""The partitioned history tables (migration 0021, taskline.store.partitions) against real
PostgreSQL and Redis: partitions created ahead and rolled, expired partitions dropped or
replaced by their kept rows (a dead job outlives its partition mates), a live lease holding
its partition, the hot lease statements pruned to the partitions of their ids, and the
statements by job id reading indexes."""

from __future__ import annotations

import json
import re
import uuid

from sqlalchemy import text

from taskline.dispatch.dispatcher import Dispatcher
from taskline.settings import Settings
from taskline.store.partitions import ANALYZE_AFTER, TABLES, WIDTH, Partition
from taskline.store.queries import queries_for
from taskline.store.store import Store, lease_span
from taskline_maintenance.retention import Retention
from tests.helpers import enqueue, fail, succeed
from tests.integration.test_maintenance_retention import backdate, claimed
from tests.integration.test_store_plans import generic_plan

DAY_S = 86_400.0
RETAINED = {"retain_succeeded_s": 7 * DAY_S, "retain_cancelled_s": 7 * DAY_S,
            "retain_dead_s": 30 * DAY_S}
BOUNDS = "AND l.id BETWEEN CAST(:lease_min AS bigint) AND CAST(:lease_max AS bigint)"
"""The lease statements' bounds on their ids (what prunes a generic plan's partitions)."""


def partitions(store: Store, table: str) -> list[Partition]:
    with store.engine.connect() as conn:
        return store.partitions.list(conn, table)


def current(store: Store, table: str) -> Partition:
    with store.engine.connect() as conn:
        nxt = store.partitions.next_id(conn, table)
    return next(p for p in partitions(store, table)
                if p.lower is not None and p.upper is not None and p.lower <= nxt < p.upper)


def history_of(store: Store, job_id: uuid.UUID) -> tuple[int, int]:
    with store.transaction() as conn:
        return tuple(conn.execute(text(f"SELECT count(*) FROM taskline.{t} WHERE job_id = :id"),
                                  {"id": job_id}).scalar_one() for t in TABLES)  # type: ignore[return-value]


def age_history(store: Store, days: int) -> None:
    """Every event and lease written `days` ago (the instant partitions are judged by)."""
    with store.transaction() as conn:
        conn.execute(text("UPDATE taskline.job_events SET created_at = created_at - "
                          "make_interval(days => :d)"), {"d": days})
        conn.execute(text("UPDATE taskline.job_leases SET leased_at = leased_at - "
                          "make_interval(days => :d)"), {"d": days})


def test_a_pass_creates_partitions_ahead_and_rolls_a_day_old_partition(
        store: Store, dispatcher: Dispatcher, settings: Settings):
    retention = Retention(store, dispatcher, settings.replace(history_partitions_ahead=9))
    assert {s.table: s.ahead for s in store.partitions.state()} == {t: 7 for t in TABLES}
    retention.run_once()  # the migration made 7 ahead; the setting says 9
    states = {s.table: s for s in store.partitions.state()}
    assert {t: s.ahead for t, s in states.items()} == {t: 9 for t in TABLES}
    assert not any(s.default_rows for s in states.values())
    before = {t: current(store, t) for t in TABLES}

    claim = claimed(store, dispatcher)  # an event and a lease in the current partitions
    retention.run_once()
    assert {t: current(store, t) for t in TABLES} == before, "a fresh partition is kept"

    age_history(store, 2)
    assert sorted(store.partitions.roll(DAY_S)) == sorted(TABLES)
    after = {t: current(store, t) for t in TABLES}
    assert {t: p.lower for t, p in after.items()} == {t: before[t].upper for t in TABLES}
    assert succeed(store, claim.lease_id, "w1")  # the lease in the rolled partition still fences
    retention.run_once()
    assert {s.table: s.ahead for s in store.partitions.state()} == {t: 9 for t in TABLES}


def test_a_dead_job_survives_the_expiry_of_its_partition_mates(
        store: Store, dispatcher: Dispatcher, settings: Settings):
    retention = Retention(store, dispatcher, settings.replace(**RETAINED))
    done = claimed(store, dispatcher)
    assert succeed(store, done.lease_id, "w1")
    dying = claimed(store, dispatcher, max_retries=0)
    assert fail(store, dying.lease_id, "w1")
    waiting = enqueue(store, dispatcher, push=False)  # unfinished: kept whatever its age
    old = {t: current(store, t) for t in TABLES}
    age_history(store, 10)
    store.partitions.roll(DAY_S)
    backdate(store, [done.job.id], days=10)  # past the 7 days of succeeded jobs
    backdate(store, [dying.job.id], days=10)  # well inside the 30 days of dead ones

    retention.run_once()

    assert history_of(store, done.job.id) == (0, 0)  # its job expired, its partition went
    assert history_of(store, dying.job.id) == (3, 1)  # enqueued, claimed, dead; one lease
    assert history_of(store, waiting.id) == (1, 0)
    for table, part in old.items():  # replaced by the copy of its kept rows, same bounds
        assert any(p.name == part.name and (p.lower, p.upper) == (part.lower, part.upper)
                   for p in partitions(store, table))
    with store.transaction() as conn:
        kept = conn.execute(text(f"SELECT count(*) FROM taskline.{old['job_events'].name}"))
        assert kept.scalar_one() == 4

    # Once the dead job and the waiting one are gone, the partition is dropped whole.
    with store.transaction() as conn:
        conn.execute(text("DELETE FROM taskline.jobs WHERE id = ANY(:ids)"),
                     {"ids": [dying.job.id, waiting.id]})
    retention.run_once()
    names = {p.name for t in TABLES for p in partitions(store, t)}
    assert not names & {p.name for p in old.values()}
    assert history_of(store, dying.job.id) == (0, 0)


def test_a_partition_holding_a_live_lease_is_left_until_it_is_released(
        store: Store, dispatcher: Dispatcher, settings: Settings):
    retention = Retention(store, dispatcher, settings.replace(**RETAINED))
    running = claimed(store, dispatcher)
    leases = current(store, "job_leases")
    age_history(store, 10)
    store.partitions.roll(DAY_S)
    retention.run_once()
    assert store.partitions.expire(leases) is None
    assert leases.name in {p.name for p in partitions(store, "job_leases")}
    assert store.renew_leases([running.lease_id], "w1", 60)
    assert succeed(store, running.lease_id, "w1")
    backdate(store, [running.job.id], days=10)
    retention.run_once()
    assert leases.name not in {p.name for p in partitions(store, "job_leases")}


def plan_relations(store: Store, statement: str, params: dict) -> set[str]:
    """The relations the plan of `statement` reads (tables and indexes)."""
    sql = queries_for(store.schema)[statement].text
    with store.transaction() as conn:
        plan = conn.execute(text("EXPLAIN (FORMAT JSON) " + sql), params).scalar_one()
    found: set[str] = set()

    def walk(node: dict) -> None:
        if "Relation Name" in node:
            found.add(f"{node['Node Type']}:{node['Relation Name']}")
        for child in node.get("Plans", []):
            walk(child)
    walk((plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"])
    return found


def history_partitions_read(relations: set[str]) -> set[str]:
    """The partitions of the history tables a plan reads (an insert's target is the parent)."""
    names = {r.split(":", 1)[1] for r in relations}
    return {n for n in names if n.startswith(("job_events_", "job_leases_"))}


def test_the_hot_lease_statements_read_at_most_two_partitions(
        store: Store, dispatcher: Dispatcher):
    claims = [claimed(store, dispatcher) for _ in range(2)]
    store.partitions.ensure_ahead(5)
    ids = "{" + ",".join(str(c.lease_id) for c in claims) + "}"
    span = lease_span([c.lease_id for c in claims])
    renew = plan_relations(store, "renew_leases",
                           {"lease_ids": ids, "worker_id": "w1", "lease_s": 60, **span})
    assert history_partitions_read(renew) <= {current(store, "job_leases").name}
    settle = plan_relations(store, "settle", {"lease_ids": ids, "settlements": "{}", **span})
    partitions_read = history_partitions_read(settle)
    assert len({p for p in partitions_read if p.startswith("job_leases_")}) <= 1
    assert len(partitions_read) <= 2  # the lease's and, for the insert, none: routed per row
    progress = plan_relations(store, "write_progress", {
        "lease_id": claims[0].lease_id, "worker_id": "w1", "progress": "0.5", "event": "x",
        "sources": "{running}"})
    assert len(history_partitions_read(progress)) <= 2


def partitions_scanned(plan: str) -> set[str]:
    """The history partitions an EXPLAIN's scan nodes read (pruned ones have none)."""
    return set(re.findall(r"Scan (?:using \S+ )?on (job_(?:leases|events)_\w+)", plan))


def test_the_worker_generic_plans_prune_the_lease_partitions(
        store: Store, dispatcher: Dispatcher):
    """The worker runs its statements on generic plans (store.make_engine), which cannot prune
    partitions by an id array: the lease statements' bounds on the ids prune all but the
    partition of their leases when the plan starts, however many partitions there are."""
    claims = [claimed(store, dispatcher) for _ in range(2)]
    store.partitions.ensure_ahead(9)
    lease_ids = sorted(c.lease_id for c in claims)
    own = {current(store, "job_leases").name}
    settle = settle_plan(store, lease_ids)
    assert "Subplans Removed" in settle and partitions_scanned(settle) == own, settle
    renew = generic_plan(store, "renew_leases", {"lease_ids": "bigint[]", "lease_min": "bigint",
                                                 "lease_max": "bigint", "worker_id": "text",
                                                 "lease_s": "float8"},
                         f"'{{{','.join(map(str, lease_ids))}}}', {lease_ids[0]}, "
                         f"{lease_ids[-1]}, 'w1', 60")
    assert "Subplans Removed" in renew and partitions_scanned(renew) == own, renew
    lean = generic_plan(store, "settle_succeeded", {
        "results": "text", "outcome": "text", "lease_ids": "bigint[]", "lease_min": "bigint",
        "lease_max": "bigint", "worker_id": "text", "status": "text", "event": "text"},
        f"'{{}}', 'succeeded', '{{{','.join(map(str, lease_ids))}}}', {lease_ids[0]}, "
        f"{lease_ids[-1]}, 'w1', 'succeeded', 'succeeded'")
    assert "Subplans Removed" in lean and partitions_scanned(lean) == own, lean
    unbounded = str(queries_for(store.schema)["settle"]).replace(BOUNDS, "")
    whole = settle_plan(store, lease_ids, unbounded)
    assert len(partitions_scanned(whole)) > len(own) + 8, "by the array alone: every partition"


def test_reads_by_job_use_each_partitions_index(store: Store, dispatcher: Dispatcher):
    job = enqueue(store, dispatcher)
    for name in ("get_events", "get_leases"):
        relations = plan_relations(store, name, {"id": job.id})
        assert history_partitions_read(relations), relations
        assert not any(r.startswith("Seq Scan:") for r in relations), relations


def test_ids_keep_their_partition_width(store: Store, dispatcher: Dispatcher):
    claim = claimed(store, dispatcher)
    part = current(store, "job_leases")
    assert part.lower is not None and part.upper == part.lower + WIDTH
    assert part.lower <= claim.lease_id < part.upper


def reltuples(store: Store, part: Partition) -> float:
    with store.engine.connect() as conn:
        return float(conn.execute(text("SELECT reltuples FROM pg_class WHERE oid = "
                                       "to_regclass(:t)"), {"t": f"taskline.{part.name}"}
                                  ).scalar_one())


def settle_plan(store: Store, lease_ids: list[int], sql: str | None = None) -> str:
    """The settle's generic plan (the worker's prepared statement), as EXPLAIN shows it; `sql`
    another text of it."""
    ids = "{" + ",".join(map(str, lease_ids)) + "}"
    types = {"settlements": "text", "lease_ids": "bigint[]", "lease_min": "bigint",
             "lease_max": "bigint"}
    return generic_plan(store, "settle", types,
                        f"'{{}}', '{ids}', {min(lease_ids)}, {max(lease_ids)}", sql)


def previous_settle(store: Store) -> str:
    """The settle as the release before migration 0027 wrote it: through live_leases, its
    leases found by the id array alone."""
    return str(queries_for(store.schema)["settle"]).replace(
        "live_leases_by_id", "live_leases").replace(BOUNDS, "")


def reads_open_lease_index(plan: str) -> bool:
    return "_open" in plan or "leased_until_idx" in plan


def ended_history(store: Store, count: int) -> None:
    """`count` ended attempts in the current lease partition, no vacuum since: each still has
    its entry in the open-lease index."""
    with store.transaction() as conn:
        conn.execute(text(
            "INSERT INTO taskline.job_leases (job_id, attempt, worker_id, leased_at, "
            "leased_until, released_at, outcome) SELECT gen_random_uuid(), 1, 'w0', now(), "
            "now(), now(), 'succeeded' FROM generate_series(1, :n)"), {"n": count})


def test_the_settle_reads_its_leases_by_primary_key_without_statistics(
        store: Store, dispatcher: Dispatcher):
    """Through live_leases_by_id (migration 0027) the settle's generic plan never reads the
    open-lease index, whose entries for every lease ended since the last vacuum it would read
    whole where the partition has no statistics; the settle written before 0027, through
    live_leases, still does: the same view's rows with the plain test beside."""
    part = current(store, "job_leases")
    lease_ids = [claimed(store, dispatcher).lease_id for _ in range(3)]
    ended_history(store, 20 * ANALYZE_AFTER)
    assert reltuples(store, part) < 0, "never analyzed"
    shown = settle_plan(store, lease_ids)
    assert "pkey" in shown and not reads_open_lease_index(shown), shown
    assert reads_open_lease_index(settle_plan(store, lease_ids, previous_settle(store)))


def test_a_pass_analyzes_a_new_partition_once_it_has_rows(
        store: Store, dispatcher: Dispatcher, settings: Settings):
    """A partition never analyzed (no autovacuum yet, or none at all) gets its statistics from
    maintenance once it holds ANALYZE_AFTER rows; the settle of a release before migration 0027,
    running beside this one through a rolling deploy, then reads its leases by primary key
    alone, not the open-lease index with every ended lease in it."""
    retention = Retention(store, dispatcher, settings)
    part = current(store, "job_leases")
    claims = [claimed(store, dispatcher) for _ in range(3)]
    retention.run_once()
    assert reltuples(store, part) < 0, "too few rows yet: left to autovacuum"
    ended_history(store, 20 * ANALYZE_AFTER)
    lease_ids = [c.lease_id for c in claims]
    before = previous_settle(store)
    assert reads_open_lease_index(settle_plan(store, lease_ids, before)), (
        "without statistics the plan reads the open-lease index")
    retention.run_once()
    assert reltuples(store, part) >= 20 * ANALYZE_AFTER
    shown = settle_plan(store, lease_ids, before)
    assert not reads_open_lease_index(shown), shown
    assert store.partitions.analyze_new() == [], "analyzed once; autovacuum keeps it after"
