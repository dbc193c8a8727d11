"""Run leases and checkpoints: who trains a run, when it last said so, how often it was started.

runs.worker           the worker holding the run's lease (hostname and pid), null when none
runs.heartbeat_at     when that worker last renewed the lease; a lease older than GRPO_LEASE_SECONDS
                      means the worker is gone, and the run goes back to the queue
runs.attempts         how many times a worker has started (or resumed) the run
runs.checkpoint_step  the step of the run's latest saved checkpoint, null when none

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("worker", sa.Text(), nullable=True))
        batch.add_column(sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("checkpoint_step", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("checkpoint_step")
        batch.drop_column("attempts")
        batch.drop_column("heartbeat_at")
        batch.drop_column("worker")
