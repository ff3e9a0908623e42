"""Initial schema: jobs, job_leases, job_events, dead_letter_jobs, workers, leader_leases.

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-29 09:23:50.849714
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('jobs',
    sa.Column('id', sa.UUID(), nullable=False),
    sa.Column('type', sa.Text(), nullable=False),
    sa.Column('queue', sa.Text(), nullable=False),
    sa.Column('payload', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('priority', sa.SmallInteger(), nullable=False),
    sa.Column('status', sa.Text(), nullable=False),
    sa.Column('attempts', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('max_retries', sa.Integer(), nullable=False),
    sa.Column('timeout_s', sa.Float(), nullable=False),
    sa.Column('next_run_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('idempotency_key', sa.Text(), nullable=True),
    sa.Column('request_hash', sa.Text(), nullable=True),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.Column('result', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('cancel_requested', sa.Boolean(), server_default=sa.text('false'), nullable=False),
    sa.Column('trace_context', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("status IN ('scheduled','queued','running','retrying','succeeded','dead','cancelled')", name='jobs_status_valid'),
    sa.CheckConstraint('attempts >= 0', name='jobs_attempts_nonnegative'),
    sa.CheckConstraint('priority BETWEEN 0 AND 9', name='jobs_priority_range'),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('jobs_created', 'jobs', ['created_at', 'id'], unique=False)
    op.create_index('jobs_due', 'jobs', ['next_run_at'], unique=False, postgresql_where=sa.text("status IN ('scheduled', 'retrying')"))
    op.create_index('jobs_pending_id', 'jobs', ['id'], unique=False, postgresql_where=sa.text("status IN ('queued', 'scheduled', 'retrying')"))
    op.create_index('jobs_queue_idempotency_key', 'jobs', ['queue', 'idempotency_key'], unique=True, postgresql_where=sa.text('idempotency_key IS NOT NULL'))
    op.create_index('jobs_status_created', 'jobs', ['status', 'created_at', 'id'], unique=False)
    op.create_table('leader_leases',
    sa.Column('name', sa.Text(), nullable=False),
    sa.Column('holder', sa.Text(), nullable=False),
    sa.Column('leased_until', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('name')
    )
    op.create_table('workers',
    sa.Column('id', sa.Text(), nullable=False),
    sa.Column('hostname', sa.Text(), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=False),
    sa.Column('queues', postgresql.ARRAY(sa.Text()), nullable=False),
    sa.Column('concurrency', sa.Integer(), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('last_heartbeat', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('active_jobs', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('stopped_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('dead_letter_jobs',
    sa.Column('job_id', sa.UUID(), nullable=False),
    sa.Column('final_error', sa.Text(), nullable=True),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('failed_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('job_id')
    )
    op.create_index('dead_letter_jobs_failed', 'dead_letter_jobs', ['failed_at', 'job_id'], unique=False)
    op.create_table('job_events',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('job_id', sa.UUID(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('event', sa.Text(), nullable=False),
    sa.Column('worker_id', sa.Text(), nullable=True),
    sa.Column('detail', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('clock_timestamp()'), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('job_events_job', 'job_events', ['job_id', 'id'], unique=False)
    op.create_table('job_leases',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('job_id', sa.UUID(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('worker_id', sa.Text(), nullable=False),
    sa.Column('leased_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('leased_until', sa.DateTime(timezone=True), nullable=False),
    sa.Column('released_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('outcome', sa.Text(), nullable=True),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('job_leases_job', 'job_leases', ['job_id', 'id'], unique=False)
    op.create_index('job_leases_open', 'job_leases', ['leased_until'], unique=False, postgresql_where=sa.text('released_at IS NULL'))


def downgrade() -> None:
    op.drop_index('job_leases_open', table_name='job_leases', postgresql_where=sa.text('released_at IS NULL'))
    op.drop_index('job_leases_job', table_name='job_leases')
    op.drop_table('job_leases')
    op.drop_index('job_events_job', table_name='job_events')
    op.drop_table('job_events')
    op.drop_index('dead_letter_jobs_failed', table_name='dead_letter_jobs')
    op.drop_table('dead_letter_jobs')
    op.drop_table('workers')
    op.drop_table('leader_leases')
    op.drop_index('jobs_status_created', table_name='jobs')
    op.drop_index('jobs_queue_idempotency_key', table_name='jobs', postgresql_where=sa.text('idempotency_key IS NOT NULL'))
    op.drop_index('jobs_pending_id', table_name='jobs', postgresql_where=sa.text("status IN ('queued', 'scheduled', 'retrying')"))
    op.drop_index('jobs_due', table_name='jobs', postgresql_where=sa.text("status IN ('scheduled', 'retrying')"))
    op.drop_index('jobs_created', table_name='jobs')
    op.drop_table('jobs')
