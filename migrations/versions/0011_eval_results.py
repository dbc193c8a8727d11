"""eval_results: every held-out question's outputs at each evaluation of a run.

One row per question per evaluation: the run, the evaluation's step, the question's place in the held-out split, the
question and its reference, the greedy output with the final answer the verifier read under the run's answer_match
(null: none), the form that held it, its verdict and whether it stated an answer in the strict form; ``samples`` the
eval_samples sampled outputs, each as the same five fields (null with greedy evaluation only). Deleted with the run.

Revision ID: 0011
Revises: 0010
Create Date: 2027-05-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "eval_results",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("question_index", sa.Integer(), nullable=False),
        sa.Column("question", sa.Text(), nullable=False),
        sa.Column("reference", sa.Text(), nullable=False),
        sa.Column("completion", sa.Text(), nullable=False),
        sa.Column("answer", sa.Text(), nullable=True),
        sa.Column("answer_rule", sa.String(16), nullable=False),
        sa.Column("correct", sa.Boolean(), nullable=False),
        sa.Column("formatted", sa.Boolean(), nullable=False),
        sa.Column("samples", sa.JSON(), nullable=True),
    )
    op.create_index("ix_eval_results_run_id_step", "eval_results", ["run_id", "step"])


def downgrade() -> None:
    op.drop_index("ix_eval_results_run_id_step", table_name="eval_results")
    op.drop_table("eval_results")
