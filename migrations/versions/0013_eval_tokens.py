"""eval_results.tokens: each held-out output's tokens, as the groups record a sample's.

The greedy output's tokens (each token's text in context, then the end token's where it ended) in a new JSON column;
each sampled output's in its entry of ``samples``. Null for the outputs recorded before.

Revision ID: 0013
Revises: 0012
Create Date: 2027-06-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("eval_results", sa.Column("tokens", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("eval_results", recreate="never") as batch:  # SQLite 3.35+ drops it in place
        batch.drop_column("tokens")
