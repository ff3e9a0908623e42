"""Audit trail: the audit_log table (append-only) and the actor of each job event.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-14 10:00:00.000000

Online-safe next to code of revision 0002: a new, empty table with its indexes (nothing else
reads or locks it), and a nullable column without default on job_events, which PostgreSQL
adds by a catalog change alone (no table rewrite). Code of 0002 names its columns when it
writes events (INSERT and COPY column lists), so it keeps working and writes NULL actors.
The ALTER still needs a brief exclusive lock on job_events: `lock_timeout` makes it give up
instead of queueing every writer behind a long transaction; `taskline migrate` can be rerun.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None

APPEND_ONLY = """
CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only: records are never updated';
END;
$$;
CREATE TRIGGER audit_log_append_only BEFORE UPDATE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();
"""


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.create_table('audit_log',
    sa.Column('id', sa.UUID(), server_default=sa.text('gen_random_uuid()'), nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), server_default=sa.text('clock_timestamp()'), nullable=False),
    sa.Column('actor', sa.Text(), nullable=True),
    sa.Column('action', sa.Text(), nullable=False),
    sa.Column('target', sa.Text(), nullable=True),
    sa.Column('detail', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('audit_log_at', 'audit_log', ['at', 'id'], unique=False)
    op.create_index('audit_log_actor', 'audit_log', ['actor', 'at', 'id'], unique=False)
    op.execute(APPEND_ONLY)
    op.add_column('job_events', sa.Column('actor', sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column('job_events', 'actor')
    op.execute("DROP TRIGGER audit_log_append_only ON audit_log")
    op.execute("DROP FUNCTION audit_log_append_only()")
    op.drop_index('audit_log_actor', table_name='audit_log')
    op.drop_index('audit_log_at', table_name='audit_log')
    op.drop_table('audit_log')
