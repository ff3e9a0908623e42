"""The PostgreSQL schema as SQLAlchemy Core metadata.

The migrations in `migrations/versions` create exactly this; a test applies them to an empty
database and compares the result with this metadata, so the two cannot drift apart. The
history tables' autovacuum storage parameters (migration 0011) are not metadata; a test of
their own holds them.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    Table,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID

from taskline.jobs import Status

metadata = MetaData()

NOW = text("now()")
# The predicate of the partial index jobs_pending_id, in its migration's words (the planner
# matches predicates by text, so the order is kept); its states are jobs.PENDING (a unit test).
PENDING_SQL = "status IN ('queued', 'scheduled', 'retrying')"
TERMINAL_SQL = "('succeeded', 'dead', 'cancelled')"
# Every state, in the words of the CHECK constraint migration 0007 wrote
# (tests/unit/test_state_places.py holds it and the migrations to Status).
STATES_SQL = "(" + ",".join(f"'{s.value}'" for s in Status) + ")"

jobs = Table(
    "jobs",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("type", Text, nullable=False),
    Column("queue", Text, nullable=False),
    Column("payload", JSONB, nullable=False),
    Column("priority", SmallInteger, nullable=False),
    Column("status", Text, nullable=False),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("max_retries", Integer, nullable=False),
    Column("timeout_s", Float, nullable=False),
    Column("next_run_at", DateTime(timezone=True), nullable=True),
    Column("idempotency_key", Text, nullable=True),
    Column("request_hash", Text, nullable=True),
    Column("last_error", Text, nullable=True),
    Column("result", JSONB, nullable=True),
    Column("cancel_requested", Boolean, nullable=False, server_default=text("false")),
    Column("trace_context", Text, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    # When the job reached its terminal state: set by its terminal transition only, cleared by
    # a requeue; retention counts from it (migration 0003).
    Column("finished_at", DateTime(timezone=True), nullable=True),
    # A workflow step names its workflow and its step id; `pending_parents` counts its parents
    # that have not succeeded yet (the success of the last one queues it; migration 0007).
    Column("workflow_id", UUID(as_uuid=True), nullable=True),
    Column("step", Text, nullable=True),
    Column("pending_parents", Integer, nullable=False, server_default=text("0")),
    # A step's condition: NULL waits for every parent's success; `any_failed` and `always`
    # count each parent's first finish, whatever it was (migration 0016).
    Column("run_when", Text, nullable=True),
    # The budget the job draws from under a `per_key` flow limit (migration 0010).
    Column("limit_key", Text, nullable=True),
    # Jobs of a queue with one `ordering_key` start one at a time, in the order of
    # COALESCE(ordered_at, created_at), id; a requeue from the DLQ sets `ordered_at` (0020).
    Column("ordering_key", Text, nullable=True),
    Column("ordered_at", DateTime(timezone=True), nullable=True),
    # Times the job's handler raised Snooze, each ending an attempt not counted (0020).
    Column("snoozes", Integer, nullable=False, server_default=text("0")),
    # Up to 20 labels; GET /api/v1/jobs?tag= reads them through jobs_tags (0020).
    Column("tags", ARRAY(Text), nullable=True),
    # The last progress a running handler reported: 0..1 or a JSON object <= 4 KiB (0020).
    Column("progress", JSONB, nullable=True),
    # Not started by `expires_at`, a job is never leased and lapses (cancelled, event lapsed); a
    # step with parents keeps `start_within_s` until its release sets `expires_at` (0020).
    Column("expires_at", DateTime(timezone=True), nullable=True),
    Column("start_within_s", Float, nullable=True),
    # The schedule whose slot enqueued the job, and that slot's instant (migration 0005).
    Column("schedule", Text, nullable=True),
    Column("scheduled_for", DateTime(timezone=True), nullable=True),
    # A unique job's key (principal-scoped), a debounced job's key and the payloads that joined
    # it, first included (migration 0019; taskline.uniqueness).
    Column("unique_key", Text, nullable=True),
    Column("debounce_key", Text, nullable=True),
    Column("coalesced", JSONB, nullable=True),
    # True once a waiter asked to be woken by the job's finish: only then does the commit that
    # finishes it send its id on `<schema>_finished` (migration 0028; taskline.finishing).
    Column("watched", Boolean, nullable=True),
    CheckConstraint(f"status IN {STATES_SQL}", name="jobs_status_allowed"),
    CheckConstraint("priority BETWEEN 0 AND 9", name="jobs_priority_range"),
    CheckConstraint("attempts >= 0", name="jobs_attempts_nonnegative"),
)
Index("jobs_queue_idempotency_key", jobs.c.queue, jobs.c.idempotency_key, unique=True,
      postgresql_where=text("idempotency_key IS NOT NULL"))
Index("jobs_pending_id", jobs.c.id, postgresql_where=text(PENDING_SQL))
Index("jobs_due", jobs.c.next_run_at,
      postgresql_where=text("status IN ('scheduled', 'retrying')"))
# Lists and counts of one state, newest first; succeeded jobs, most of the table, are found
# by a backward read of jobs_created instead (migration 0022).
Index("jobs_status_created_not_succeeded", jobs.c.status, jobs.c.created_at, jobs.c.id,
      postgresql_where=text("status <> 'succeeded'"))
Index("jobs_created", jobs.c.created_at, jobs.c.id)
# Dispatch from PostgreSQL (Redis unreachable) claims through this: a queue's queued jobs in
# claim order, so a claim reads only the rows it takes, however many are queued.
Index("jobs_claimable", jobs.c.queue, jobs.c.priority.desc(), jobs.c.created_at, jobs.c.id,
      postgresql_where=text("status = 'queued'"))
# Whether a job without an ordering key is queued in a queue at or above a priority: an ordering
# key's turn started in place never overtakes one (settle_turning; migration 0023). Through
# jobs_claimable that test read every queued keyed job of the queue.
Index("jobs_plain_queued", jobs.c.queue, jobs.c.priority,
      postgresql_where=text("status = 'queued' AND ordering_key IS NULL"))
# The queues holding scheduled, retrying or waiting jobs, read one probe per queue: with
# jobs_claimable (queued) and the running jobs, the queue limit counts queues, never jobs
# (queues_in_use, migration 0024). Jobs that are only queued, run and finish never enter it.
Index("jobs_parked_queue", jobs.c.queue,
      postgresql_where=text("status IN ('scheduled', 'retrying', 'waiting')"))
# Retention reads expired jobs oldest first through these, never by scanning the table; the
# second holds the jobs a release before 0003 finished without stamping finished_at.
Index("jobs_finished", jobs.c.status, jobs.c.finished_at,
      postgresql_where=text("finished_at IS NOT NULL"))
Index("jobs_finished_unstamped", jobs.c.status, jobs.c.updated_at,
      postgresql_where=text(f"finished_at IS NULL AND status IN {TERMINAL_SQL}"))
Index("jobs_workflow", jobs.c.workflow_id, jobs.c.step,
      postgresql_where=text("workflow_id IS NOT NULL"))
Index("jobs_unique_key", jobs.c.queue, jobs.c.unique_key, jobs.c.created_at,
      postgresql_where=text("unique_key IS NOT NULL"))
Index("jobs_debounce", jobs.c.queue, jobs.c.type, jobs.c.debounce_key,
      postgresql_where=text("debounce_key IS NOT NULL AND status = 'scheduled'"))
Index("jobs_lapsing", jobs.c.expires_at,
      postgresql_where=text("expires_at IS NOT NULL AND status IN "
                            "('queued', 'scheduled', 'retrying')"))
Index("jobs_tags", jobs.c.tags, postgresql_using="gin",
      postgresql_where=text("tags IS NOT NULL"))
# A key's unfinished jobs; unkeyed jobs never enter. Superseded by jobs_ordering_line (its first
# two columns), kept while a release before 0023 may run; a later release drops it.
Index("jobs_ordering", jobs.c.queue, jobs.c.ordering_key,
      postgresql_where=text("ordering_key IS NOT NULL AND status IN "
                            "('queued', 'scheduled', 'retrying', 'running')"))
# A key's line in order (migration 0023): its next job (settle's turns) is the first entry after
# the finished one, and the claim rule's "none earlier in line" one probe.
Index("jobs_ordering_line", jobs.c.queue, jobs.c.ordering_key,
      func.coalesce(jobs.c.ordered_at, jobs.c.created_at), jobs.c.id,
      postgresql_where=text("ordering_key IS NOT NULL AND status IN "
                            "('queued', 'scheduled', 'retrying', 'running')"))
# The claim rule's "none of the key running": at most one entry a key (migration 0023).
Index("jobs_ordering_running", jobs.c.queue, jobs.c.ordering_key,
      postgresql_where=text("ordering_key IS NOT NULL AND status = 'running'"))

# The history tables are partitioned by RANGE (id) (migration 0021, taskline.store.partitions):
# no foreign key to jobs, a deleted job's rows go with their partition.
job_leases = Table(
    "job_leases",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("job_id", UUID(as_uuid=True), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("worker_id", Text, nullable=False),
    Column("leased_at", DateTime(timezone=True), nullable=False),
    Column("leased_until", DateTime(timezone=True), nullable=False),
    Column("released_at", DateTime(timezone=True), nullable=True),
    Column("outcome", Text, nullable=True),
    postgresql_partition_by="RANGE (id)",
)
Index("job_leases_job", job_leases.c.job_id, job_leases.c.id)
Index("job_leases_open", job_leases.c.leased_until,
      postgresql_where=text("released_at IS NULL"))

job_events = Table(
    "job_events",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("job_id", UUID(as_uuid=True), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("event", Text, nullable=False),
    Column("worker_id", Text, nullable=True),
    Column("detail", JSONB, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False,
           server_default=text("clock_timestamp()")),
    # Who caused the event through the API (token name or JWT `sub`); NULL for the engine.
    Column("actor", Text, nullable=True),
    postgresql_partition_by="RANGE (id)",
)
Index("job_events_job", job_events.c.job_id, job_events.c.id)

dead_letter_jobs = Table(
    "dead_letter_jobs",
    metadata,
    Column("job_id", UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="CASCADE"),
           primary_key=True),
    Column("final_error", Text, nullable=True),
    Column("attempts", Integer, nullable=False),
    Column("failed_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    # The cause of final_error (taskline.fingerprint): the DLQ's groups. NULL only on a row the
    # earlier release dead-lettered during a rolling deploy (migration 0015).
    Column("fingerprint", Text, nullable=True),
)
Index("dead_letter_jobs_failed", dead_letter_jobs.c.failed_at, dead_letter_jobs.c.job_id)
Index("dead_letter_jobs_fingerprint", dead_letter_jobs.c.fingerprint,
      dead_letter_jobs.c.failed_at)

workers = Table(
    "workers",
    metadata,
    Column("id", Text, primary_key=True),
    Column("hostname", Text, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("queues", ARRAY(Text), nullable=False),
    Column("concurrency", Integer, nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("last_heartbeat", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("active_jobs", Integer, nullable=False, server_default=text("0")),
    Column("stopped_at", DateTime(timezone=True), nullable=True),
    # The port of its /metrics and /readyz (NULL: off); the next free one when the default
    # was taken (migration 0014).
    Column("metrics_port", Integer, nullable=True),
    # The CPUs it is pinned to (TASKLINE_WORKER_CPUS; NULL: not pinned; migration 0026).
    Column("cpus", ARRAY(Integer), nullable=True),
)

leader_leases = Table(
    "leader_leases",
    metadata,
    Column("name", Text, primary_key=True),
    Column("holder", Text, nullable=False),
    Column("leased_until", DateTime(timezone=True), nullable=False),
)

# Paused queues, one row each (migration 0009): no claim takes a job of a queue listed here
# (the view claimable_rule holds the rule); a resume deletes the row.
queue_pauses = Table(
    "queue_pauses",
    metadata,
    Column("queue", Text, primary_key=True),
    Column("paused_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("actor", Text, nullable=True),
)

# Flow limits (migration 0010): one row per scope, locked by the claims that take its budget.
flow_limits = Table(
    "flow_limits",
    metadata,
    Column("scope", Text, primary_key=True),
    Column("concurrency", Integer, nullable=True),
    Column("rate_limit", Integer, nullable=True),
    Column("period_s", Float, nullable=True),
    Column("per_key", Boolean, nullable=False, server_default=text("false")),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    CheckConstraint("concurrency >= 1", name="flow_limits_concurrency_check"),
    CheckConstraint("rate_limit >= 1", name="flow_limits_rate_limit_check"),
    CheckConstraint("period_s > 0", name="flow_limits_period_s_check"),
    CheckConstraint("scope LIKE 'type:%' OR scope LIKE 'queue:%'", name="flow_limits_scope_kind"),
    CheckConstraint("concurrency IS NOT NULL OR rate_limit IS NOT NULL",
                    name="flow_limits_something"),
    CheckConstraint("(rate_limit IS NULL) = (period_s IS NULL)", name="flow_limits_rate_period"),
)

# Starts of rate-limited scopes, the sliding window's log: written by the budgeted claim,
# pruned by later ones once older than the scope's period.
flow_starts = Table(
    "flow_starts",
    metadata,
    Column("scope", Text, nullable=False),
    Column("limit_key", Text, nullable=False, server_default=text("''")),
    Column("started_at", DateTime(timezone=True), nullable=False),
)
Index("flow_starts_scope_started", flow_starts.c.scope, flow_starts.c.started_at)

# Operator actions that are no job event, or that delete job events (pause, limits, schedules,
# purges), and the API's cancels and requeues: appended, never updated (a trigger refuses
# UPDATE), deleted only by retention (TASKLINE_RETAIN_AUDIT_S).
audit_log = Table(
    "audit_log",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True, server_default=text("gen_random_uuid()")),
    Column("at", DateTime(timezone=True), nullable=False,
           server_default=text("clock_timestamp()")),
    Column("actor", Text, nullable=True),
    Column("action", Text, nullable=False),
    Column("target", Text, nullable=True),
    Column("detail", JSONB, nullable=True),
)
Index("audit_log_at", audit_log.c.at, audit_log.c.id)
Index("audit_log_actor", audit_log.c.actor, audit_log.c.at, audit_log.c.id)

# A workflow: its steps are jobs naming it (jobs.workflow_id); its status is derived from theirs,
# never stored.
workflows = Table(
    "workflows",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("name", Text, nullable=False),
    Column("idempotency_key", Text, nullable=True),
    Column("request_hash", Text, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=NOW),
)
Index("workflows_idempotency_key", workflows.c.idempotency_key, unique=True,
      postgresql_where=text("idempotency_key IS NOT NULL"))
Index("workflows_created", workflows.c.created_at, workflows.c.id)

# One row per edge: `child_id` waits for `parent_id` to succeed.
job_dependencies = Table(
    "job_dependencies",
    metadata,
    Column("parent_id", UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="CASCADE"),
           primary_key=True),
    Column("child_id", UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="CASCADE"),
           primary_key=True),
    # The outcome of the parent's first finish, written only on an edge to a `when` step, so
    # that step counts each parent once (migration 0016).
    Column("parent_outcome", Text, nullable=True),
)
Index("job_dependencies_child", job_dependencies.c.child_id)
# Periodic jobs (migration 0005): each schedule, and the record of every slot that fired. A
# slot's row and its job are inserted by one statement, keyed by (schedule, slot), and nothing
# deletes slots: a slot never gets a second job, whatever happened to its first.
schedules = Table(
    "schedules",
    metadata,
    Column("name", Text, primary_key=True),
    Column("cron", Text, nullable=False),
    Column("timezone", Text, nullable=False),
    Column("job", JSONB, nullable=False),
    Column("paused", Boolean, nullable=False, server_default=text("false")),
    Column("catch_up", Text, nullable=False, server_default=text("'latest'")),
    # Slots at or before it never fire: the creation, or the last change of cron, time zone or
    # pause; `revision` counts every change.
    Column("since", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("revision", BigInteger, nullable=False, server_default=text("1")),
    Column("last_slot", DateTime(timezone=True), nullable=True),
    Column("last_job_id", UUID(as_uuid=True), nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    # Migration 0019: true while the code declares it (@periodic), false once it no longer
    # does, NULL for a schedule the code never declared.
    Column("declared_in_code", Boolean, nullable=True),
    CheckConstraint("catch_up IN ('latest', 'none')", name="schedules_catch_up_valid"),
)

schedule_slots = Table(
    "schedule_slots",
    metadata,
    Column("schedule", Text, primary_key=True),
    Column("slot", DateTime(timezone=True), primary_key=True),
    Column("job_id", UUID(as_uuid=True), nullable=False),
    Column("fired_at", DateTime(timezone=True), nullable=False, server_default=NOW),
)

# Jobs enqueued inside an application's own transaction (taskline.enqueuing) that Redis has
# not heard of yet: written in the same statement as the job, so a row exists exactly when its
# job committed; the maintenance relay pushes the ids to Redis, then deletes the rows
# (migration 0008). No foreign key: a row lives milliseconds, and retention must not wait on it.
enqueue_outbox = Table(
    "enqueue_outbox",
    metadata,
    Column("job_id", UUID(as_uuid=True), primary_key=True),
    Column("queue", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=NOW),
)

# The job types each worker serves, with the JSON Schema of their declared payload (NULL: any
# payload), written by the worker at start; the API validates payloads of a declared type
# against those of workers seen within TASKLINE_TYPE_TTL_S (migration 0018). No foreign key:
# rows outlive their worker's row until they age out.
declared_types = Table(
    "declared_types",
    metadata,
    Column("type", Text, primary_key=True),
    Column("worker_id", Text, primary_key=True),
    Column("queue", Text, nullable=False),
    Column("schema", JSONB, nullable=True),
    Column("declared_at", DateTime(timezone=True), nullable=False, server_default=NOW),
)
