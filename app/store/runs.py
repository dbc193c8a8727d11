"""Runs' life cycle and leases, and the workers that hold them: small functions taking a Session.

Every function returns plain JSON-able values (dicts, lists, str, numbers); datetimes are
ISO-8601 strings in UTC. The caller owns the transaction (``app.store.db.session_scope``).

Status changes are single conditional UPDATEs, so the web process (cancel) and a worker
(start / finish) can race on the same run without one silently undoing the other.

Run life cycle:
  queued --claim_run--> running --finish_run--> completed | failed | cancelled
  queued --request_cancel--> cancelled (at once; a worker that picks the job up skips it)
  running --request_cancel--> running with cancel_requested; the worker stops at the next step
  running --requeue_run--> queued (its worker paused it, or its lease went stale: the worker died);
                           the next worker resumes it from its last checkpoint

Leases: the worker training a run holds its lease (runs.worker) and renews it (``renew_lease``,
``records.record_step``); a lease older than GRPO_LEASE_SECONDS is stale and another worker may take the
run over. Writes of a worker that lost its lease are refused (``LeaseLost``), so a step is never
recorded by two workers.

Workers: each worker process reports its queues and GPUs (``report_worker``) when it starts and at each
of its stale-lease checks; ``live_workers`` are those seen recently, whose GPUs launch checks a run's
memory against.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from app.core.run_status import FINISHED_STATUSES, RunStatus
from app.store.models import IdHighWater, Run, Worker, utcnow


class LeaseLost(RuntimeError):
    """The worker writing for a run no longer holds its lease (another worker took the run over)."""


def default_run_name(model: str) -> str:
    """The name of a run launched without one: '<model>-<YYYYmmdd-HHMMSS>' (UTC), from the last part of a model
    id or path."""
    short = model.rstrip("/").rsplit("/", 1)[-1] or "run"
    return f"{short}-{datetime.now(timezone.utc).strftime('%Y%m%d-%H%M%S')}"


def iso(value: datetime | None) -> str | None:
    """A stored datetime as ISO-8601 in UTC (None stays None)."""
    return None if value is None else value.astimezone(timezone.utc).isoformat()


UPSERT = {"sqlite": sqlite_insert, "postgresql": postgresql_insert}  # INSERT ... ON CONFLICT, per dialect


def create_run(s: Session, spec: dict[str, Any], name: str) -> int:
    """Insert a queued run for a validated spec (``RunSpec.to_dict()``); return its id."""
    run = Run(
        name=name,
        status=RunStatus.QUEUED,
        config=spec,
        model=spec["model"],
        dataset=spec["dataset"],
        supervision=spec["supervision"],
        step=0,
        total_steps=spec["iterations"] * spec["steps_per_iteration"],
        cancel_requested=False,
    )
    if _numbers_rows_itself(s):
        run.id = _next_run_id()
    s.add(run)
    s.flush()
    return run.id


def _numbers_rows_itself(s: Session) -> bool:
    """Whether the store numbers runs itself: on SQLite, whose max(id) + 1 would reuse a deleted run's id
    (models.IdHighWater); PostgreSQL's sequence never reuses one."""
    return s.get_bind().dialect.name == "sqlite"


def _next_run_id():
    """One more than every run id ever used: the larger of the largest present and the high-water mark, read in
    the INSERT itself (one statement, so two launches at once cannot read the same number)."""
    present = select(func.coalesce(func.max(Run.id), 0)).scalar_subquery()
    mark = select(func.coalesce(func.max(IdHighWater.value), 0)).where(IdHighWater.name == "runs").scalar_subquery()
    return select(func.max(present, mark) + 1).scalar_subquery()


def raise_high_water(s: Session, run_id: int) -> None:
    """Run ``run_id`` is being deleted: keep its id in the high-water mark (SQLite), so no later run takes it."""
    if _numbers_rows_itself(s):
        s.execute(
            UPSERT["sqlite"](IdHighWater)
            .values(name="runs", value=run_id)
            .on_conflict_do_update(
                index_elements=[IdHighWater.name], set_={"value": func.max(IdHighWater.value, run_id)}
            )
        )


SUMMARY_COLUMNS = (
    Run.id,
    Run.name,
    Run.status,
    Run.model,
    Run.dataset,
    Run.supervision,
    Run.step,
    Run.total_steps,
    Run.created_at,
    Run.started_at,
    Run.finished_at,
    Run.phase,
    Run.phase_done,
    Run.phase_total,
    Run.notes,
    Run.tags,
    Run.archived,
)


def run_summary(row) -> dict[str, Any]:
    """A run as ``list_runs`` shows it, from a row with SUMMARY_COLUMNS (or a Run)."""
    return {
        "run_id": row.id,
        "name": row.name,
        "status": row.status,
        "model": row.model,
        "dataset": row.dataset,
        "supervision": row.supervision,
        "step": row.step,
        "total_steps": row.total_steps,
        "created_at": iso(row.created_at),
        "started_at": iso(row.started_at),
        "finished_at": iso(row.finished_at),
        "phase": row.phase,
        "phase_done": row.phase_done,
        "phase_total": row.phase_total,
        "notes": row.notes or "",
        "tags": [t for t in (row.tags or "").split(",") if t],
        "archived": bool(row.archived),
    }


def get_run(s: Session, run_id: int) -> dict[str, Any] | None:
    """One run: its summary, its run spec (``config``), error, times, lease and newest checkpoint."""
    run = s.get(Run, run_id)
    if run is None:
        return None
    return {
        **run_summary(run),
        "config": run.config,
        "error": run.error,
        "cancel_requested": run.cancel_requested,
        "worker": run.worker,
        "heartbeat_at": iso(run.heartbeat_at),
        "attempts": run.attempts,
        "checkpoint_step": run.checkpoint_step,
    }


def list_runs(s: Session) -> list[dict[str, Any]]:
    """Every run, newest first (without the spec)."""
    return [run_summary(row) for row in s.execute(select(*SUMMARY_COLUMNS).order_by(Run.id.desc()))]


def mark_running(s: Session, run_id: int, total_steps: int) -> None:
    """queued (or running again, for a redelivered job) -> running; the first started_at is kept.

    A run cancelled meanwhile stays cancelled (and ``is_cancel_requested`` says so).
    """
    s.execute(
        update(Run)
        .where(Run.id == run_id, Run.status.in_((RunStatus.QUEUED, RunStatus.RUNNING)))
        .values(status=RunStatus.RUNNING, total_steps=total_steps, started_at=func.coalesce(Run.started_at, utcnow()))
    )


def claim_run(s: Session, run_id: int, worker: str, lease_seconds: float) -> bool:
    """Take the run's lease for ``worker``: a queued run, or a running one whose lease is stale.

    One conditional UPDATE, so of two workers handed the same run only one gets it. The run becomes
    ``running``, its attempts count goes up by one. Returns whether ``worker`` now holds the lease.
    """
    now = utcnow()
    stale = now - timedelta(seconds=lease_seconds)
    claimable = (Run.status == RunStatus.QUEUED) | (
        (Run.status == RunStatus.RUNNING) & (Run.heartbeat_at.is_(None) | (Run.heartbeat_at < stale))
    )
    result = s.execute(
        update(Run)
        .where(Run.id == run_id, Run.cancel_requested.is_(False), claimable)
        .values(
            status=RunStatus.RUNNING,
            worker=worker,
            heartbeat_at=now,
            attempts=Run.attempts + 1,
            started_at=func.coalesce(Run.started_at, now),
        )
    )
    return result.rowcount == 1


def renew_lease(s: Session, run_id: int, worker: str) -> bool:
    """``worker`` is still training the run: renew its lease. False when it no longer holds it. (On the table,
    not through the ORM: a worker renews with every step it records.)"""
    runs = Run.__table__
    result = s.execute(
        update(runs)
        .where(runs.c.id == run_id, runs.c.worker == worker, runs.c.status == RunStatus.RUNNING)
        .values(heartbeat_at=utcnow())
    )
    return result.rowcount == 1


def requeue_run(s: Session, run_id: int, worker: str | None = None) -> bool:
    """Put a running run back in the queue (``worker`` given: only if it holds the lease), with no phase.
    True if it was."""
    condition = [Run.id == run_id, Run.status == RunStatus.RUNNING]
    if worker is not None:
        condition.append(Run.worker == worker)
    result = s.execute(
        update(Run).where(*condition).values(status=RunStatus.QUEUED, worker=None, heartbeat_at=None, **NO_PHASE)
    )
    return result.rowcount == 1


def requeue_stale_runs(s: Session, lease_seconds: float) -> list[dict[str, Any]]:
    """Put back in the queue every running run whose lease is older than ``lease_seconds`` (its worker
    is gone). Returns ``{run_id, worker, config}`` of each run requeued here (a run another process
    requeued at the same moment is not in the list)."""
    stale = utcnow() - timedelta(seconds=lease_seconds)
    is_stale = Run.heartbeat_at.is_(None) | (Run.heartbeat_at < stale)  # no heartbeat recorded: stale too
    rows = s.execute(select(Run.id, Run.worker, Run.config).where(Run.status == RunStatus.RUNNING, is_stale)).all()
    requeued = []
    for row in rows:
        result = s.execute(
            update(Run)
            .where(Run.id == row.id, Run.status == RunStatus.RUNNING, is_stale)
            .values(status=RunStatus.QUEUED, worker=None, heartbeat_at=None, **NO_PHASE)
        )
        if result.rowcount == 1:
            requeued.append({"run_id": row.id, "worker": row.worker, "config": row.config})
    return requeued


NO_PHASE = {"phase": None, "phase_done": None, "phase_total": None}  # a run that is not running has no phase


def set_phase(
    s: Session, run_id: int, name: str, done: int | None = None, total: int | None = None, worker: str | None = None
) -> bool:
    """What a running run is doing now (``name``, e.g. "loading model", "training") and how far (``done`` of
    ``total`` in the phase's own units, None without a count). Only a running run has a phase, and with
    ``worker`` given only while that worker holds its lease; returns whether the run was changed."""
    condition = [Run.id == run_id, Run.status == RunStatus.RUNNING] + (
        [Run.worker == worker] if worker is not None else []
    )
    result = s.execute(update(Run).where(*condition).values(phase=name, phase_done=done, phase_total=total))
    return result.rowcount == 1


def record_checkpoint(s: Session, run_id: int, step: int) -> None:
    """The run's latest checkpoint is now the one saved after ``step``."""
    s.execute(update(Run).where(Run.id == run_id).values(checkpoint_step=step))


def finish_run(s: Session, run_id: int, status: str, error: str | None = None, worker: str | None = None) -> bool:
    """Record the end of a run: completed, failed (with the error text) or cancelled.

    ``worker`` given: only if that worker holds the run's lease. The lease is released and the phase
    cleared. Returns whether the run was changed.
    """
    if status not in FINISHED_STATUSES:
        raise ValueError(f"finish_run: status must be one of {FINISHED_STATUSES}, got {status!r}")
    condition = [Run.id == run_id] + ([Run.worker == worker] if worker is not None else [])
    result = s.execute(
        update(Run)
        .where(*condition)
        .values(status=status, error=error, finished_at=utcnow(), worker=None, heartbeat_at=None, **NO_PHASE)
    )
    return result.rowcount == 1


def request_cancel(s: Session, run_id: int) -> dict[str, Any]:
    """Cancel a run: a queued run is cancelled at once, a running one is asked to stop.

    Finished runs are left as they are. Returns ``{run_id, status}``; raises LookupError
    for an unknown run.
    """
    s.execute(
        update(Run)
        .where(Run.id == run_id, Run.status == RunStatus.QUEUED)
        .values(status=RunStatus.CANCELLED, finished_at=utcnow())
    )
    s.execute(update(Run).where(Run.id == run_id, Run.status == RunStatus.RUNNING).values(cancel_requested=True))
    status = s.scalar(select(Run.status).where(Run.id == run_id))
    if status is None:
        raise LookupError(f"run {run_id} does not exist")
    return {"run_id": run_id, "status": status}


def is_cancel_requested(s: Session, run_id: int) -> bool:
    """True when the worker should stop: cancel requested, the run already cancelled, or deleted."""
    row = s.execute(select(Run.cancel_requested, Run.status).where(Run.id == run_id)).first()
    return row is None or row.cancel_requested or row.status == RunStatus.CANCELLED


# ---- workers --------------------------------------------------------------------------------


def report_worker(s: Session, name: str, queues: list[str], gpus: list[dict[str, Any]]) -> None:
    """Worker ``name`` (hostname:pid) is alive, consumes ``queues`` and has ``gpus`` ([{"name", "memory"}],
    memory in bytes; [] without a GPU): insert its row, or update it with seen_at now (one upsert)."""
    gpus = [{"name": str(gpu["name"]), "memory": int(gpu["memory"])} for gpu in gpus]
    upsert = UPSERT[s.get_bind().dialect.name]
    statement = upsert(Worker).values(name=name, queues=",".join(queues), gpus=gpus, seen_at=utcnow())
    statement = statement.on_conflict_do_update(
        index_elements=[Worker.name],
        set_={
            "queues": statement.excluded.queues,
            "gpus": statement.excluded.gpus,
            "seen_at": statement.excluded.seen_at,
        },
    )
    s.execute(statement)


def live_workers(s: Session, within_seconds: float) -> list[dict[str, Any]]:
    """The workers that reported in the last ``within_seconds``, by name: ``{name, queues (list), gpus,
    seen_at}``."""
    since = utcnow() - timedelta(seconds=within_seconds)
    rows = s.scalars(select(Worker).where(Worker.seen_at >= since).order_by(Worker.name))
    return [
        {"name": w.name, "queues": [q for q in w.queues.split(",") if q], "gpus": w.gpus, "seen_at": iso(w.seen_at)}
        for w in rows
    ]
