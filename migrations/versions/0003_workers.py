"""Workers: which worker processes are alive, the queues they consume and the GPUs they have.

workers.name     the worker process as run leases name it (workers.runner.WORKER_NAME: hostname:pid)
workers.queues   the Celery queues it consumes, comma-separated (e.g. "grpo,grpo.gpu")
workers.gpus     its GPUs as torch sees them (after CUDA_VISIBLE_DEVICES): a JSON list of
                 {"name": "NVIDIA A10G", "memory": total bytes}; [] on a machine without a GPU
workers.seen_at  when it last reported (at start, then at each of its stale-lease checks, 4 times per
                 GRPO_LEASE_SECONDS); a worker not seen for 2 x GRPO_LEASE_SECONDS is gone. Launch
                 compares a run's estimated memory with the GPUs of the workers still seen.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-10
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "workers",
        sa.Column("name", sa.Text(), primary_key=True),
        sa.Column("queues", sa.Text(), nullable=False),
        sa.Column("gpus", sa.JSON(), nullable=False),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("workers")
