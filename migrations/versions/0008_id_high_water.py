"""id_high_water: the largest run id ever handed out, so that SQLite never gives a deleted run's id to a new run.

SQLite numbers a new row max(id) + 1: once the newest run is deleted, the next run would take its id. The store
numbers SQLite's runs above ``id_high_water.value`` (name "runs") and raises it when it deletes a run. The row
starts at the largest id present (ids deleted before this migration cannot be known). PostgreSQL's sequences
never reuse an id; the table exists there too, unused, so the schema is the same on both.

Revision ID: 0008
Revises: 0007
Create Date: 2027-03-08
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "id_high_water",
        sa.Column("name", sa.Text(), primary_key=True),
        sa.Column("value", sa.Integer(), nullable=False),
    )
    op.execute("INSERT INTO id_high_water (name, value) SELECT 'runs', COALESCE(MAX(id), 0) FROM runs")


def downgrade() -> None:
    op.drop_table("id_high_water")
