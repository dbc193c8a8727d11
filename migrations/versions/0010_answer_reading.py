"""answer_reading: the final answer the verifier read from each sample, and the rule that read it.

samples.answer        the final answer the verifier read under the run's answer_match (null: it read none)
samples.answer_rule   the form that held it, as rewards.final_answer names it: 'gsm8k' (strict ####), 'boxed'
                      (strict \\boxed{}), 'number' (flexible's last number) or 'none'

Rows recorded before this revision keep both null (their reading was not recorded: the dashboard says so rather
than reading the text again under today's rules). Both columns are nullable and added in place, without
rebuilding the table (rebuilding samples on SQLite would cost a copy of every sample).

Revision ID: 0010
Revises: 0009
Create Date: 2027-04-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("samples", recreate="never") as batch:
        batch.add_column(sa.Column("answer", sa.Text(), nullable=True))
        batch.add_column(sa.Column("answer_rule", sa.String(16), nullable=True))


def downgrade() -> None:
    # recreate="never": SQLite drops the columns in place (3.35+); recreating samples would copy every row
    with op.batch_alter_table("samples", recreate="never") as batch:
        batch.drop_column("answer_rule")
        batch.drop_column("answer")
