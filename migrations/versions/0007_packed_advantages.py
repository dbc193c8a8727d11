"""samples.advantages as one packed array: little-endian float64, one per token (was a JSON list).

A worker records every output's advantages at every step; encoding them as JSON text was the largest part of
writing a step's samples. float64 keeps every value the engine records exactly, as the JSON did.

Existing rows are converted in place, a chunk at a time (and back by the downgrade). The column is nullable in the schema (a recorded sample
always has one): SQLite adds and drops columns without rebuilding the table, and rebuilding samples would
delete what references it.

Revision ID: 0007
Revises: 0006
Create Date: 2027-03-01
"""

from __future__ import annotations

import json
import struct

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

CHUNK = 1000  # rows read and updated at a time


def pack(values: list[float]) -> bytes:
    """Little-endian float64 (app.store.groups.pack with 'd', frozen here)."""
    return struct.pack(f"<{len(values)}d", *values)


def unpack(data: bytes) -> list[float]:
    """The floats ``pack`` stored."""
    return list(struct.unpack(f"<{len(data) // 8}d", data))


def _convert(new_type, convert) -> None:
    """Replace samples.advantages by a column of ``new_type`` holding ``convert(old value)`` for each row."""
    with op.batch_alter_table("samples", recreate="never") as batch:
        batch.add_column(sa.Column("advantages_new", new_type, nullable=True))
    conn = op.get_bind()
    last = 0
    while True:
        rows = conn.execute(
            sa.text("SELECT id, advantages FROM samples WHERE id > :last ORDER BY id LIMIT :n"),
            {"last": last, "n": CHUNK},
        ).all()
        if not rows:
            break
        updates = [{"i": sample_id, "a": None if value is None else convert(value)} for sample_id, value in rows]
        conn.execute(
            sa.text("UPDATE samples SET advantages_new = :a WHERE id = :i").bindparams(
                sa.bindparam("a", type_=new_type)
            ),
            updates,
        )
        last = rows[-1][0]
    with op.batch_alter_table("samples", recreate="never") as batch:
        batch.drop_column("advantages")
        batch.alter_column("advantages_new", new_column_name="advantages")


def upgrade() -> None:
    _convert(sa.LargeBinary(), lambda value: pack(json.loads(value) if isinstance(value, str) else value))


def downgrade() -> None:
    _convert(sa.JSON(), lambda value: unpack(bytes(value)))  # the JSON column again, nullable now
