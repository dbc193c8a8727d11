"""The store's tables as SQLAlchemy 2 models.

The schema itself is created and changed only by the Alembic migrations in
``migrations/versions``; these models must stay in step with them (a test compares the two).

runs 1-n metrics     one row per finished step: {step, iteration, values: {metric: float}}
runs 1-n groups      the G outputs sampled for one question at one step, with reward mean/std
groups 1-n samples   one output: completion, decoded tokens, per-token advantages, rewards, step labels, the
                     columns a search filters on (run, step, length, verdicts), the verifier's reading (the answer
                     it read and its rule), per-token log-probs / ratio / KL
runs 1-n run_logs    human-readable lines from the worker / engine
Deleting a run deletes everything under it (ON DELETE CASCADE).
workers              each worker process's queues and GPUs, and when it last reported
id_high_water        the largest run id ever handed out (SQLite), so a deleted run's id is never reused
runs 1-n eval_results  each held-out question's outputs at each evaluation
runs 1-n tries       a question tried by hand on the run's models (the request, then the worker's outputs)
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

from app.core.run_status import RUN_STATUS_CHECK


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class UtcDateTime(TypeDecorator):
    """A timezone-aware UTC datetime on every backend.

    PostgreSQL stores ``timestamptz``; SQLite has no time zones, so values are stored as UTC
    and read back with ``tzinfo=UTC`` attached.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: store timezone-aware UTC datetimes")
        return value.astimezone(timezone.utc)

    def process_result_value(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


class Base(DeclarativeBase):
    pass


class Run(Base):
    """One training run: its spec, where it stands, and when things happened."""

    __tablename__ = "runs"
    __table_args__ = (CheckConstraint(RUN_STATUS_CHECK, name="ck_runs_status"),)

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), index=True)  # a RunStatus (app.core.run_status)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)  # the validated run spec
    # Copied from config so the run list needs no JSON access.
    model: Mapped[str] = mapped_column(Text)
    dataset: Mapped[str] = mapped_column(Text)
    supervision: Mapped[str] = mapped_column(String(16))
    step: Mapped[int] = mapped_column(default=0)  # last finished step (1-based; 0 = none yet)
    total_steps: Mapped[int]
    error: Mapped[str | None] = mapped_column(Text)
    cancel_requested: Mapped[bool] = mapped_column(default=False)
    # The lease: the worker training the run renews heartbeat_at; a stale one is requeued.
    worker: Mapped[str | None] = mapped_column(Text)
    heartbeat_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    attempts: Mapped[int] = mapped_column(default=0, server_default="0")  # starts and resumptions by workers
    checkpoint_step: Mapped[int | None]  # step of the latest saved checkpoint
    # What the run is doing now ("loading model", "training", ...) and how far, in the phase's own units.
    phase: Mapped[str | None] = mapped_column(Text)
    phase_done: Mapped[int | None]
    phase_total: Mapped[int | None]
    # What users write on a run.
    notes: Mapped[str] = mapped_column(Text, default="", server_default="")
    tags: Mapped[str] = mapped_column(Text, default="", server_default="")  # comma-separated
    archived: Mapped[bool] = mapped_column(default=False, server_default=false())
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, onupdate=utcnow)


class Metric(Base):
    """The metrics of one finished step of a run."""

    __tablename__ = "metrics"
    __table_args__ = (UniqueConstraint("run_id", "step", name="uq_metrics_run_id_step"),)

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    step: Mapped[int]
    iteration: Mapped[int]
    values: Mapped[dict[str, float | None]] = mapped_column(JSON)  # {"reward_mean": .., "kl": .., ...}


class Group(Base):
    """The G outputs sampled for one question at one step."""

    __tablename__ = "groups"
    __table_args__ = (Index("ix_groups_run_id_step", "run_id", "step"), Index("ix_groups_question_key", "question_key"))

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    step: Mapped[int]
    position: Mapped[int]  # order of the group within its step (0-based)
    prompt: Mapped[str] = mapped_column(Text)  # the question
    model_prompt: Mapped[str | None] = mapped_column(Text)  # the prompt text as the model saw it (its template)
    reference: Mapped[str] = mapped_column(Text)
    reward_mean: Mapped[float] = mapped_column(Float)
    reward_std: Mapped[float] = mapped_column(Float)  # population std of the G rewards
    kind: Mapped[str | None] = mapped_column(String(16))  # 'all_right' / 'all_wrong' / 'mixed' (the verifier's)
    question_key: Mapped[str | None] = mapped_column(String(40))  # sha1 of prompt: one question across steps, runs

    samples: Mapped[list[Sample]] = relationship(
        order_by="Sample.position", cascade="all, delete-orphan", passive_deletes=True
    )


class Sample(Base):
    """One output of a group: its text, tokens, per-token advantages and rewards; the columns a search filters on;
    per-token arrays of what the update saw (float32 / uint8 bytes, ``groups.pack`` / ``unpack``)."""

    __tablename__ = "samples"
    __table_args__ = (
        Index("ix_samples_run_id_step", "run_id", "step"),
        Index("ix_samples_run_id_reward", "run_id", "reward"),
        Index("ix_samples_run_id_length", "run_id", "length"),
    )

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    group_id: Mapped[int] = mapped_column(ForeignKey("groups.id", ondelete="CASCADE"), index=True)
    run_id: Mapped[int | None]  # the group's run and step, copied: a run's samples are searched by index alone
    step: Mapped[int | None]
    position: Mapped[int]  # i in 0..G-1
    completion: Mapped[str] = mapped_column(Text)
    tokens: Mapped[list[str]] = mapped_column(JSON)  # decoded text of each completion token
    # A_hat[i, t], one per token: little-endian float64 (always set; nullable only so that migration 0007 could
    # add it to SQLite without rebuilding the table)
    advantages: Mapped[bytes | None] = mapped_column(LargeBinary)
    reward: Mapped[float] = mapped_column(Float)
    step_rewards: Mapped[list[float] | None] = mapped_column(JSON(none_as_null=True))  # process supervision
    step_end_indices: Mapped[list[int] | None] = mapped_column(JSON(none_as_null=True))  # 0-based token indices
    # process: the rules' label of each step, and with rollout labels the share of its continuations that
    # reached the answer (null when the steps were not labelled by rules)
    step_labels: Mapped[list[float] | None] = mapped_column(JSON(none_as_null=True))
    step_shares: Mapped[list[float] | None] = mapped_column(JSON(none_as_null=True))
    reward_components: Mapped[dict[str, float]] = mapped_column(JSON)
    length: Mapped[int | None]  # completion tokens, the end token included
    correct: Mapped[bool | None]  # the verifier accepted the final answer
    # the verifier read a final answer under the run's answer_match (with 'flexible' a last number counts)
    answer_found: Mapped[bool | None]
    # the final answer the verifier read (null: none) and the form that held it (rewards.final_answer: gsm8k, boxed,
    # number, none); both null for samples recorded before migration 0010
    answer: Mapped[str | None] = mapped_column(Text)
    answer_rule: Mapped[str | None] = mapped_column(String(16))
    truncated: Mapped[bool | None]  # cut at max_new_tokens without an end token
    # per token (null when not recorded): log pi_old at sampling, log pi_ref, the ratio and k3 KL at the last update
    # (little-endian float32 each), and whether the clip bound it (uint8)
    logprobs: Mapped[bytes | None] = mapped_column(LargeBinary)
    ref_logprobs: Mapped[bytes | None] = mapped_column(LargeBinary)
    ratios: Mapped[bytes | None] = mapped_column(LargeBinary)
    kls: Mapped[bytes | None] = mapped_column(LargeBinary)
    clipped: Mapped[bytes | None] = mapped_column(LargeBinary)


class RunLog(Base):
    """One human-readable line about a run."""

    __tablename__ = "run_logs"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    message: Mapped[str] = mapped_column(Text)


class Worker(Base):
    """A worker process: the queues it consumes, its GPUs, and when it last reported."""

    __tablename__ = "workers"

    name: Mapped[str] = mapped_column(Text, primary_key=True)  # hostname:pid, as run leases name it
    queues: Mapped[str] = mapped_column(Text)  # comma-separated Celery queue names
    gpus: Mapped[list[dict[str, Any]]] = mapped_column(JSON)  # [{"name": str, "memory": bytes}]; [] without a GPU
    seen_at: Mapped[datetime] = mapped_column(UtcDateTime)


class IdHighWater(Base):
    """The largest id a table has ever handed out, for SQLite: it numbers a new row max(id) + 1, so deleting the
    newest run would give its id to the next run, and a service still holding that id would read someone else's
    run. The store numbers SQLite's runs above this mark (store.create_run) and raises it when a run is deleted
    (store.delete_run). PostgreSQL's sequences never reuse an id, so there the table stays unused."""

    __tablename__ = "id_high_water"

    name: Mapped[str] = mapped_column(Text, primary_key=True)  # the table: "runs"
    value: Mapped[int]


class EvalResult(Base):
    """One held-out question at one evaluation of a run: its greedy output, read as the verifier reads it, with its
    tokens, and the eval_samples sampled outputs (JSON: completion, answer, answer_rule, correct, formatted, tokens
    each)."""

    __tablename__ = "eval_results"
    __table_args__ = (Index("ix_eval_results_run_id_step", "run_id", "step"),)

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    step: Mapped[int]  # the evaluation's step (0: before training)
    question_index: Mapped[int]  # its place in the run's held-out split
    question: Mapped[str] = mapped_column(Text)
    reference: Mapped[str] = mapped_column(Text)
    completion: Mapped[str] = mapped_column(Text)  # the greedy output
    answer: Mapped[str | None] = mapped_column(Text)  # the final answer read from it (null: none)
    answer_rule: Mapped[str] = mapped_column(String(16))  # gsm8k, boxed, number or none
    correct: Mapped[bool]
    formatted: Mapped[bool]
    samples: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)  # the sampled outputs (null: greedy only)
    tokens: Mapped[list[str] | None] = mapped_column(JSON)  # the greedy output's tokens' texts (null: not kept)


class Try(Base):
    """A question tried by hand on a run's models ("Try a question"): the request the dashboard queued and the
    outputs a worker sampled for it (app.service.tries, workers/tries.py)."""

    __tablename__ = "tries"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    status: Mapped[str] = mapped_column(String(16))  # queued, running, done, failed, expired
    request: Mapped[dict[str, Any]] = mapped_column(JSON)  # models, question, reference, g, max_new_tokens, ...
    result: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)  # one entry per model tried
    error: Mapped[str | None] = mapped_column(Text)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
