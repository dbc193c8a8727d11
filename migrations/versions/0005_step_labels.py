"""The rules' step labels beside a process sample's step rewards.

samples.step_labels  process supervision: the rules' label of each step (1.0 / 0.0, or the share of continuations
                     that reached the answer with label_estimate 'soft'); beside a learned PRM's step rewards they
                     are the rule checker's verdicts; null when the steps were not labelled by rules, for outcome
                     supervision and for samples recorded before this revision
samples.step_shares  step_labels 'rollouts': for each step, the share of its N continuations that reached the
                     reference answer (the last step: the output's own verdict, 1.0 / 0.0); null otherwise

Revision ID: 0005
Revises: 0004
Create Date: 2027-01-15
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("samples") as batch:
        batch.add_column(sa.Column("step_labels", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("step_shares", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("samples") as batch:
        batch.drop_column("step_shares")
        batch.drop_column("step_labels")
