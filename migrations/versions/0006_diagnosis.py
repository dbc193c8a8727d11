"""What diagnosing a run searches and reads: indexed columns for every sample and group, per-token arrays.

groups.kind           'all_right' / 'all_wrong' / 'mixed': whether the verifier accepted all, none or some of the
                      group's outputs (its zero spread is reward_std = 0)
groups.question_key   sha1 of the question text (hex): one question's groups across steps and runs
samples.run_id, step  the sample's group's run and step (copied so a run's samples are searched by index alone)
samples.length        completion tokens, the end token included
samples.correct       the verifier accepted the final answer; answer_found: a final answer was found at all
samples.truncated     cut at max_new_tokens without an end token (null for samples recorded before this revision)
samples.logprobs      per token, one little-endian float32 array each: the policy's log-prob at sampling time,
samples.ref_logprobs  the reference's log-prob (null with kl_coef 0), the ratio pi_theta / pi_old and the k3 KL at
samples.ratios        the last policy update; clipped: one uint8 per token, 1 where the clip bound the update;
samples.kls           all null for samples recorded before this revision
samples.clipped

The columns of earlier rows are filled from what they recorded (kind, question_key, run_id, step, length, correct,
answer_found); their token arrays and truncation stay null.

Revision ID: 0006
Revises: 0005
Create Date: 2027-02-01
"""

from __future__ import annotations

import hashlib
import json

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

ARRAYS = ("logprobs", "ref_logprobs", "ratios", "kls", "clipped")
CHUNK = 1000  # rows read and updated at a time by the backfill


def upgrade() -> None:
    with op.batch_alter_table("groups") as batch:
        batch.add_column(sa.Column("kind", sa.String(16), nullable=True))
        batch.add_column(sa.Column("question_key", sa.String(40), nullable=True))
        batch.create_index("ix_groups_question_key", ["question_key"])
    with op.batch_alter_table("samples") as batch:
        batch.add_column(sa.Column("run_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("step", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("length", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("correct", sa.Boolean(), nullable=True))
        batch.add_column(sa.Column("answer_found", sa.Boolean(), nullable=True))
        batch.add_column(sa.Column("truncated", sa.Boolean(), nullable=True))
        for name in ARRAYS:
            batch.add_column(sa.Column(name, sa.LargeBinary(), nullable=True))
        batch.create_index("ix_samples_run_id_step", ["run_id", "step"])
        batch.create_index("ix_samples_run_id_reward", ["run_id", "reward"])
        batch.create_index("ix_samples_run_id_length", ["run_id", "length"])
    _backfill(op.get_bind())


def _backfill(conn) -> None:
    """Fill the new columns of rows recorded before this revision from their JSON."""
    conn.execute(
        sa.text(
            "UPDATE samples SET run_id = (SELECT groups.run_id FROM groups WHERE groups.id = samples.group_id), "
            "step = (SELECT groups.step FROM groups WHERE groups.id = samples.group_id)"
        )
    )
    last = 0
    verdicts: dict[int, list[bool]] = {}  # group id -> its samples' verdicts
    while True:
        rows = conn.execute(
            sa.text(
                "SELECT id, group_id, tokens, reward_components FROM samples WHERE id > :last ORDER BY id LIMIT :n"
            ),
            {"last": last, "n": CHUNK},
        ).all()
        if not rows:
            break
        updates = []
        for sample_id, group_id, tokens, components in rows:
            tokens = json.loads(tokens) if isinstance(tokens, str) else tokens
            components = json.loads(components) if isinstance(components, str) else components or {}
            correct = bool(components.get("correct", 0.0) > 0)
            verdicts.setdefault(group_id, []).append(correct)
            updates.append(
                {
                    "i": sample_id,
                    "n": len(tokens or []),
                    "c": correct,
                    "f": bool(components.get("formatted", 1.0 if correct else 0.0) > 0),
                }
            )
        conn.execute(sa.text("UPDATE samples SET length = :n, correct = :c, answer_found = :f WHERE id = :i"), updates)
        last = rows[-1][0]
    groups = conn.execute(sa.text("SELECT id, prompt FROM groups")).all()
    updates = [
        {"i": group_id, "k": group_kind(verdicts.get(group_id, [])), "q": question_key(prompt)}
        for group_id, prompt in groups
    ]
    for start in range(0, len(updates), CHUNK):
        conn.execute(
            sa.text("UPDATE groups SET kind = :k, question_key = :q WHERE id = :i"), updates[start : start + CHUNK]
        )


def group_kind(verdicts: list[bool]) -> str:
    """The kind of a group from its outputs' verdicts (app.store.groups.group_kind, frozen here)."""
    right = sum(verdicts)
    return "all_right" if verdicts and right == len(verdicts) else "all_wrong" if right == 0 else "mixed"


def question_key(question: str) -> str:
    """sha1 of the question text (app.store.groups.question_key, frozen here)."""
    return hashlib.sha1(question.encode("utf-8")).hexdigest()


def downgrade() -> None:
    # recreate="never": SQLite drops the columns in place (3.35+); recreating the groups table would cascade into
    # deleting every sample
    with op.batch_alter_table("samples", recreate="never") as batch:
        for name in ("ix_samples_run_id_length", "ix_samples_run_id_reward", "ix_samples_run_id_step"):
            batch.drop_index(name)
        for name in (*ARRAYS[::-1], "truncated", "answer_found", "correct", "length", "step", "run_id"):
            batch.drop_column(name)
    with op.batch_alter_table("groups", recreate="never") as batch:
        batch.drop_index("ix_groups_question_key")
        batch.drop_column("question_key")
        batch.drop_column("kind")
