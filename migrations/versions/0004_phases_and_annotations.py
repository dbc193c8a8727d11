"""Run phases and what users write on runs.

runs.phase        what the run is doing now, in words a user reads: "loading model", "building built-in model",
                  "loading dataset", "training reward model", "training", "evaluating", "saving"; null before a
                  worker picks the run up and after it ends
runs.phase_done   how far the phase is, in its own units (built-in model: warm-up steps; reward model: labelled
runs.phase_total  samples; training: steps); null when the phase has no count
runs.notes        free text a user wrote about the run
runs.tags         comma-separated tags a user gave the run ("baseline,lr-sweep")
runs.archived     hidden from the Runs table unless asked for; nothing is deleted
groups.model_prompt  the prompt text as the model saw it (after the run's prompt_template: an instruct model's
                  chat template, or the plain template); null for groups recorded before this revision

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("phase", sa.Text(), nullable=True))
        batch.add_column(sa.Column("phase_done", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("phase_total", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("notes", sa.Text(), nullable=False, server_default=""))
        batch.add_column(sa.Column("tags", sa.Text(), nullable=False, server_default=""))
        batch.add_column(sa.Column("archived", sa.Boolean(), nullable=False, server_default=sa.false()))
    with op.batch_alter_table("groups") as batch:
        batch.add_column(sa.Column("model_prompt", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("groups") as batch:
        batch.drop_column("model_prompt")
    with op.batch_alter_table("runs") as batch:
        for column in ("archived", "tags", "notes", "phase_total", "phase_done", "phase"):
            batch.drop_column(column)
