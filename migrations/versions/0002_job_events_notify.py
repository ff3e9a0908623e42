"""Publish every committed job_events row on the `taskline_events` channel (LISTEN/NOTIFY).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02 10:00:00.000000

Invariant: a listener hears an event only when the transaction that wrote it commits, in commit
order, and hears each one once per LISTEN connection; a rolled-back state change is never
heard. The payload is built by `taskline_event_payload`, which the replay query
(`events_after` in queries.sql) calls too, so a replayed event and a live one are the same
text. Every field is bounded (text cut with left()), so the payload stays far below
NOTIFY's 8,000-byte limit and the trigger can never fail the transaction that fired it.
"""

from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None

PAYLOAD_FUNCTION = """
CREATE OR REPLACE FUNCTION taskline_event_payload(
    id bigint, job_id uuid, attempt integer, event text, worker_id text, detail jsonb,
    created_at timestamptz, queue text, type text, priority smallint) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT json_build_object(
        'id', id, 'job_id', job_id, 'attempt', attempt, 'event', left(event, 64),
        'worker_id', left(worker_id, 200),
        'created_at', to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'queue', left(queue, 200), 'type', left(type, 200), 'priority', priority,
        'to', left(detail ->> 'status', 32), 'error', left(detail ->> 'error', 300))::text
$$
"""

NOTIFY_FUNCTION = """
CREATE OR REPLACE FUNCTION taskline_notify_job_events() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- One statement-level call per INSERT (a batch of 1,000 events is one set-based pass),
    -- notifications queued in id order; PostgreSQL delivers them only at COMMIT.
    PERFORM pg_notify('taskline_events', s.payload)
    FROM (SELECT taskline_event_payload(e.id, e.job_id, e.attempt, e.event, e.worker_id,
                                        e.detail, e.created_at, j.queue, j.type, j.priority)
                 AS payload
          FROM inserted e
          -- One primary-key lookup per event (OFFSET 0 keeps the planner from turning this
          -- into a hash join that scans all of jobs for a large batch).
          LEFT JOIN LATERAL (SELECT queue, type, priority FROM jobs
                             WHERE jobs.id = e.job_id OFFSET 0) j ON true
          ORDER BY e.id) s;
    RETURN NULL;
END
$$
"""

TRIGGER = """
CREATE TRIGGER job_events_notify AFTER INSERT ON job_events
REFERENCING NEW TABLE AS inserted
FOR EACH STATEMENT EXECUTE FUNCTION taskline_notify_job_events()
"""


def upgrade() -> None:
    op.execute(PAYLOAD_FUNCTION)
    op.execute(NOTIFY_FUNCTION)
    op.execute(TRIGGER)


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS job_events_notify ON job_events")
    op.execute("DROP FUNCTION IF EXISTS taskline_notify_job_events()")
    op.execute("DROP FUNCTION IF EXISTS taskline_event_payload("
               "bigint, uuid, integer, text, text, jsonb, timestamptz, text, text, smallint)")
