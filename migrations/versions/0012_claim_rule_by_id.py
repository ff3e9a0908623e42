"""The claim rule for claims by id: `claimable_rule`, so a claim reads its jobs by primary key
whatever the statistics say.

`claimable_jobs` (0009, 0010) states the rule as "queued, and its queue not paused", with
`status = 'queued'` written literally so that scans over the queued jobs of a queue or a scope
(the budgeted claim's candidates, a limit's held count) read the index `jobs_claimable` in
order. A claim of given ids flattened that same literal into its plan, so the planner could
also reach those ids by reading every queued job: with statistics taken while the queue was
empty it estimates one queued job, and reads the whole backlog once per id (a claim of 64 ids
over 200,000 queued jobs took minutes; workers stalled while the backlog grew). The running
jobs' statements had the same trap and avoid it by testing the state as `(...) IS TRUE`, which
no index predicate follows from (tests/integration/test_store_plans.py).

So the rule's gates (the queue not paused, whether a flow limit applies) move to
`claimable_rule`, a view of every job with its `status`; `claimable_jobs` becomes that view's
queued jobs, with the same columns, the same literal and so the same plans as before. Claims
by id (`claim_jobs`, `claim_refusals`) read `claimable_rule` with the state tested as
`(status = 'queued') IS TRUE`: the only way to their rows is then the primary key.

Online on a 100-million-row `jobs`: CREATE VIEW and CREATE OR REPLACE VIEW touch the catalog
only; nothing is locked beyond that or rewritten.

Rolling deploy beside the previous release: its statements read `claimable_jobs`, whose
columns, rows and plans are unchanged; this release's claims read `claimable_rule`. Both apply
the same gates, now written once, in `claimable_rule`.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01 16:10:00
"""

from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None

CLAIMABLE_RULE = """
CREATE OR REPLACE VIEW claimable_rule AS
SELECT j.id, j.queue, j.priority, j.created_at,
       EXISTS (SELECT 1 FROM flow_limits f
               WHERE f.scope IN ('type:' || j.type, 'queue:' || j.queue)) AS limited,
       j.type, j.limit_key, j.status
FROM jobs j
WHERE NOT EXISTS (SELECT 1 FROM queue_pauses p WHERE p.queue = j.queue)
"""

CLAIMABLE_JOBS = """
CREATE OR REPLACE VIEW claimable_jobs AS
SELECT r.id, r.queue, r.priority, r.created_at, r.limited, r.type, r.limit_key
FROM claimable_rule r
WHERE r.status = 'queued'
"""

CLAIMABLE_JOBS_0010 = """
CREATE OR REPLACE VIEW claimable_jobs AS
SELECT j.id, j.queue, j.priority, j.created_at,
       EXISTS (SELECT 1 FROM flow_limits f
               WHERE f.scope IN ('type:' || j.type, 'queue:' || j.queue)) AS limited,
       j.type, j.limit_key
FROM jobs j
WHERE j.status = 'queued'
  AND NOT EXISTS (SELECT 1 FROM queue_pauses p WHERE p.queue = j.queue)
"""


def upgrade() -> None:
    op.execute(CLAIMABLE_RULE)
    op.execute(CLAIMABLE_JOBS)


def downgrade() -> None:
    op.execute(CLAIMABLE_JOBS_0010)
    op.execute("DROP VIEW IF EXISTS claimable_rule")
