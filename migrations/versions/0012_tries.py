"""tries: questions tried by hand on a run's models.

One row per try: the run, when it was asked, its status (queued, running, done, failed, expired), the request (the
models tried, the question and its reference, G, max_new_tokens, the seed and the time limit), the outputs a worker
sampled (one entry per model; null until done) and the error of a failed try. Deleted with the run.

Revision ID: 0012
Revises: 0011
Create Date: 2027-06-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tries",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_tries_run_id", "tries", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_tries_run_id", table_name="tries")
    op.drop_table("tries")
