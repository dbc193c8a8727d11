"""Data access for runs, metrics, groups, samples and logs: small functions taking a Session.

Every function returns plain JSON-able values (dicts, lists, str, numbers); datetimes are
ISO-8601 strings in UTC. The caller owns the transaction (``app.db.session_scope``).

Status changes are single conditional UPDATEs, so the web process (cancel) and a worker
(start / finish) can race on the same run without one silently undoing the other.

Run life cycle:
  queued --claim_run--> running --finish_run--> completed | failed | cancelled
  queued --request_cancel--> cancelled (at once; a worker that picks the job up skips it)
  running --request_cancel--> running with cancel_requested; the worker stops at the next step
  running --requeue_run--> queued (its worker paused it, or its lease went stale: the worker died);
                           the next worker resumes it from its last checkpoint

Leases: the worker training a run holds its lease (runs.worker) and renews it (``renew_lease``,
``record_step``); a lease older than GRPO_LEASE_SECONDS is stale and another worker may take the
run over. Writes of a worker that lost its lease are refused (``LeaseLost``), so a step is never
recorded by two workers.

Workers: each worker process reports its queues and GPUs (``report_worker``) when it starts and at each
of its stale-lease checks; ``live_workers`` are those seen recently, whose GPUs launch checks a run's
memory against.
"""
from __future__ import annotations

import math
import statistics
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from app.models import Group, Metric, Run, RunLog, Sample, Worker

RUN_STATUSES = ("queued", "running", "completed", "failed", "cancelled")
FINISHED_STATUSES = ("completed", "failed", "cancelled")


class LeaseLost(RuntimeError):
    """The worker writing for a run no longer holds its lease (another worker took the run over)."""


def default_run_name(model: str) -> str:
    """The name of a run launched without one: '<model>-<YYYYmmdd-HHMMSS>' (UTC), from the last part of a model
    id or path."""
    short = model.rstrip("/").rsplit("/", 1)[-1] or "run"
    return f"{short}-{datetime.now(timezone.utc).strftime('%Y%m%d-%H%M%S')}"


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(timezone.utc).isoformat()


def _finite_or_none(value: Any) -> float | None:
    """A metric as a JSON number: NaN / inf (a diverged run) become null."""
    value = float(value)
    return value if math.isfinite(value) else None


# ---- runs -----------------------------------------------------------------------------------


def create_run(s: Session, spec: dict[str, Any], name: str) -> int:
    """Insert a queued run for a validated spec (``RunSpec.to_dict()``); return its id."""
    run = Run(
        name=name,
        status="queued",
        config=spec,
        model=spec["model"],
        dataset=spec["dataset"],
        supervision=spec["supervision"],
        step=0,
        total_steps=spec["iterations"] * spec["steps_per_iteration"],
        cancel_requested=False,
    )
    s.add(run)
    s.flush()
    return run.id


def get_run(s: Session, run_id: int) -> dict[str, Any] | None:
    run = s.get(Run, run_id)
    if run is None:
        return None
    return {
        "run_id": run.id,
        "name": run.name,
        "status": run.status,
        "config": run.config,
        "step": run.step,
        "total_steps": run.total_steps,
        "error": run.error,
        "created_at": _iso(run.created_at),
        "started_at": _iso(run.started_at),
        "finished_at": _iso(run.finished_at),
        "cancel_requested": run.cancel_requested,
        "worker": run.worker,
        "heartbeat_at": _iso(run.heartbeat_at),
        "attempts": run.attempts,
        "checkpoint_step": run.checkpoint_step,
    }


def list_runs(s: Session) -> list[dict[str, Any]]:
    """Every run, newest first (without the spec)."""
    rows = s.execute(
        select(
            Run.id, Run.name, Run.status, Run.model, Run.dataset, Run.supervision,
            Run.step, Run.total_steps, Run.created_at,
        ).order_by(Run.id.desc())
    )
    return [
        {
            "run_id": row.id,
            "name": row.name,
            "status": row.status,
            "model": row.model,
            "dataset": row.dataset,
            "supervision": row.supervision,
            "step": row.step,
            "total_steps": row.total_steps,
            "created_at": _iso(row.created_at),
        }
        for row in rows
    ]


def mark_running(s: Session, run_id: int, total_steps: int) -> None:
    """queued (or running again, for a redelivered job) -> running; the first started_at is kept.

    A run cancelled meanwhile stays cancelled (and ``is_cancel_requested`` says so).
    """
    s.execute(
        update(Run)
        .where(Run.id == run_id, Run.status.in_(("queued", "running")))
        .values(status="running", total_steps=total_steps, started_at=func.coalesce(Run.started_at, _now()))
    )


def claim_run(s: Session, run_id: int, worker: str, lease_seconds: float) -> bool:
    """Take the run's lease for ``worker``: a queued run, or a running one whose lease is stale.

    One conditional UPDATE, so of two workers handed the same run only one gets it. The run becomes
    ``running``, its attempts count goes up by one. Returns whether ``worker`` now holds the lease.
    """
    now = _now()
    stale = now - timedelta(seconds=lease_seconds)
    claimable = (Run.status == "queued") | (
        (Run.status == "running") & (Run.heartbeat_at.is_(None) | (Run.heartbeat_at < stale)))
    result = s.execute(
        update(Run)
        .where(Run.id == run_id, Run.cancel_requested.is_(False), claimable)
        .values(status="running", worker=worker, heartbeat_at=now, attempts=Run.attempts + 1,
                started_at=func.coalesce(Run.started_at, now))
    )
    return result.rowcount == 1


def renew_lease(s: Session, run_id: int, worker: str) -> bool:
    """``worker`` is still training the run: renew its lease. False when it no longer holds it."""
    result = s.execute(update(Run).where(Run.id == run_id, Run.worker == worker, Run.status == "running")
                       .values(heartbeat_at=_now()))
    return result.rowcount == 1


def requeue_run(s: Session, run_id: int, worker: str | None = None) -> bool:
    """Put a running run back in the queue (``worker`` given: only if it holds the lease). True if it was."""
    condition = [Run.id == run_id, Run.status == "running"]
    if worker is not None:
        condition.append(Run.worker == worker)
    result = s.execute(update(Run).where(*condition).values(status="queued", worker=None, heartbeat_at=None))
    return result.rowcount == 1


def requeue_stale_runs(s: Session, lease_seconds: float) -> list[dict[str, Any]]:
    """Put back in the queue every running run whose lease is older than ``lease_seconds`` (its worker
    is gone). Returns ``{run_id, worker, config}`` of each run requeued here (a run another process
    requeued at the same moment is not in the list)."""
    stale = _now() - timedelta(seconds=lease_seconds)
    is_stale = Run.heartbeat_at.is_(None) | (Run.heartbeat_at < stale)  # no heartbeat: left by an older version
    rows = s.execute(select(Run.id, Run.worker, Run.config).where(Run.status == "running", is_stale)).all()
    requeued = []
    for row in rows:
        result = s.execute(update(Run).where(Run.id == row.id, Run.status == "running", is_stale)
                           .values(status="queued", worker=None, heartbeat_at=None))
        if result.rowcount == 1:
            requeued.append({"run_id": row.id, "worker": row.worker, "config": row.config})
    return requeued


def record_checkpoint(s: Session, run_id: int, step: int) -> None:
    """The run's latest checkpoint is now the one saved after ``step``."""
    s.execute(update(Run).where(Run.id == run_id).values(checkpoint_step=step))


def truncate_after(s: Session, run_id: int, step: int) -> None:
    """Forget what a run recorded after ``step`` (training resumes from there and records it again)."""
    s.execute(delete(Metric).where(Metric.run_id == run_id, Metric.step > step))
    s.execute(delete(Group).where(Group.run_id == run_id, Group.step > step))
    s.execute(update(Run).where(Run.id == run_id).values(step=step))


def finish_run(s: Session, run_id: int, status: str, error: str | None = None, worker: str | None = None) -> bool:
    """Record the end of a run: completed, failed (with the error text) or cancelled.

    ``worker`` given: only if that worker holds the run's lease. The lease is released. Returns
    whether the run was changed.
    """
    if status not in FINISHED_STATUSES:
        raise ValueError(f"finish_run: status must be one of {FINISHED_STATUSES}, got {status!r}")
    condition = [Run.id == run_id] + ([Run.worker == worker] if worker is not None else [])
    result = s.execute(update(Run).where(*condition).values(status=status, error=error, finished_at=_now(),
                                                            worker=None, heartbeat_at=None))
    return result.rowcount == 1


def request_cancel(s: Session, run_id: int) -> dict[str, Any]:
    """Cancel a run: a queued run is cancelled at once, a running one is asked to stop.

    Finished runs are left as they are. Returns ``{run_id, status}``; raises LookupError
    for an unknown run.
    """
    s.execute(
        update(Run).where(Run.id == run_id, Run.status == "queued").values(status="cancelled", finished_at=_now())
    )
    s.execute(update(Run).where(Run.id == run_id, Run.status == "running").values(cancel_requested=True))
    status = s.scalar(select(Run.status).where(Run.id == run_id))
    if status is None:
        raise LookupError(f"run {run_id} does not exist")
    return {"run_id": run_id, "status": status}


def is_cancel_requested(s: Session, run_id: int) -> bool:
    """True when the worker should stop: cancel requested, the run already cancelled, or deleted."""
    row = s.execute(select(Run.cancel_requested, Run.status).where(Run.id == run_id)).first()
    return row is None or row.cancel_requested or row.status == "cancelled"


# ---- metrics --------------------------------------------------------------------------------


def record_step(s: Session, run_id: int, step: int, iteration: int, metrics: dict[str, float],
                worker: str | None = None) -> None:
    """Store the metrics of one step (replacing that step's row if a resumed job repeats it).

    ``worker`` given: the write also renews that worker's lease, and raises LeaseLost (the caller's
    transaction then rolls back) when it no longer holds it.
    """
    if worker is not None and not renew_lease(s, run_id, worker):
        raise LeaseLost(f"run {run_id}: worker {worker} no longer holds the lease; step {step} not recorded")
    values = {key: _finite_or_none(value) for key, value in metrics.items()}
    dialect = s.get_bind().dialect.name
    upsert = {"sqlite": sqlite_insert, "postgresql": postgresql_insert}[dialect]
    statement = upsert(Metric).values(run_id=run_id, step=step, iteration=iteration, values=values)
    statement = statement.on_conflict_do_update(
        index_elements=[Metric.run_id, Metric.step],
        set_={"iteration": statement.excluded.iteration, "values": statement.excluded["values"]},
    )
    s.execute(statement)
    s.execute(update(Run).where(Run.id == run_id).values(step=step))


def get_metrics(s: Session, run_id: int) -> list[dict[str, Any]]:
    """One dict per recorded step, by step: ``{"step", "iteration", **metrics}``."""
    rows = s.scalars(select(Metric).where(Metric.run_id == run_id).order_by(Metric.step))
    return [{"step": m.step, "iteration": m.iteration, **m.values} for m in rows]


# ---- groups and samples ---------------------------------------------------------------------


def record_groups(s: Session, run_id: int, step: int, groups: list[dict[str, Any]]) -> None:
    """Store every group sampled at ``step`` (``GroupRecord.to_dict()`` each), replacing earlier ones.

    Each group keeps the mean and population std of its G rewards, the numbers its
    advantages were normalised with (outcome supervision).
    """
    s.execute(delete(Group).where(Group.run_id == run_id, Group.step == step))
    rows = []
    for position, group in enumerate(groups):
        rewards = [float(sample["reward"]) for sample in group["samples"]]
        row = Group(run_id=run_id, step=step, position=position, prompt=group["prompt"],
                    reference=group["reference"], reward_mean=statistics.fmean(rewards),
                    reward_std=statistics.pstdev(rewards))
        s.add(row)
        rows.append(row)
    s.flush()  # the groups get their ids; their samples go in as one multi-row insert (cheap per step)
    samples = [{"group_id": row.id, **_sample(i, sample)}
               for row, group in zip(rows, groups) for i, sample in enumerate(group["samples"])]
    if samples:
        s.execute(insert(Sample), samples)


def _sample(position: int, sample: dict[str, Any]) -> dict[str, Any]:
    """The samples row of one ``SampleRecord`` dict."""
    step_rewards = sample.get("step_rewards")
    step_end_indices = sample.get("step_end_indices")
    return dict(
        position=position,
        completion=sample["completion"],
        tokens=[str(token) for token in sample["tokens"]],
        advantages=[float(a) for a in sample["advantages"]],
        reward=float(sample["reward"]),
        step_rewards=None if step_rewards is None else [float(r) for r in step_rewards],
        step_end_indices=None if step_end_indices is None else [int(i) for i in step_end_indices],
        reward_components={key: float(v) for key, v in (sample.get("reward_components") or {}).items()},
    )


def group_steps(s: Session, run_id: int) -> list[int]:
    """The steps that have recorded groups, ascending."""
    return list(s.scalars(select(Group.step).where(Group.run_id == run_id).distinct().order_by(Group.step)))


GROUP_ORDERS = {  # how list_groups may sort a step's groups
    "position": (Group.position,),  # sampling order
    "spread": (Group.reward_std.desc(), Group.position),  # most disagreeing rewards first
    "mean": (Group.reward_mean.desc(), Group.position),  # highest mean reward first
    "mean_asc": (Group.reward_mean, Group.position),  # lowest mean reward first
}


def list_groups(s: Session, run_id: int, step: int | None = None, order: str = "position") -> list[dict[str, Any]]:
    """The groups of one step (default: the latest step with groups), sorted by ``order`` (GROUP_ORDERS)."""
    if order not in GROUP_ORDERS:
        raise ValueError(f"order must be one of {', '.join(GROUP_ORDERS)}, got {order!r}")
    if step is None:
        step = s.scalar(select(func.max(Group.step)).where(Group.run_id == run_id))
        if step is None:
            return []
    rows = s.execute(
        select(Group.id, Group.step, Group.prompt, Group.reward_mean, Group.reward_std)
        .where(Group.run_id == run_id, Group.step == step)
        .order_by(*GROUP_ORDERS[order])
    )
    return [
        {"group_id": r.id, "step": r.step, "prompt": r.prompt, "reward_mean": r.reward_mean, "reward_std": r.reward_std}
        for r in rows
    ]


def get_group(s: Session, group_id: int) -> dict[str, Any] | None:
    """A group with all its samples (tokens, per-token advantages, rewards)."""
    group = s.get(Group, group_id)
    if group is None:
        return None
    return {
        "group_id": group.id,
        "run_id": group.run_id,
        "step": group.step,
        "prompt": group.prompt,
        "reference": group.reference,
        "reward_mean": group.reward_mean,
        "reward_std": group.reward_std,
        "samples": [
            {
                "sample_id": sample.id,
                "completion": sample.completion,
                "tokens": sample.tokens,
                "reward": sample.reward,
                "step_rewards": sample.step_rewards,
                "step_end_indices": sample.step_end_indices,
                "advantages": sample.advantages,
                "reward_components": sample.reward_components,
            }
            for sample in group.samples
        ],
    }


def iter_sample_rows(s: Session, run_id: int, chunk: int = 200):
    """Every recorded sample of a run, one flat dict each, by step, group and sample position.

    Reads ``chunk`` groups at a time, so exporting a large run does not load it all at once.
    """
    last = (-1, -1)  # (step, position) of the last group read
    while True:
        groups = list(s.scalars(
            select(Group).where(Group.run_id == run_id,
                                (Group.step > last[0]) | ((Group.step == last[0]) & (Group.position > last[1])))
            .order_by(Group.step, Group.position).limit(chunk)
        ))
        if not groups:
            return
        for g in groups:
            for sample in g.samples:
                yield {
                    "run_id": run_id, "step": g.step, "group_id": g.id, "group_position": g.position,
                    "prompt": g.prompt, "reference": g.reference,
                    "group_reward_mean": g.reward_mean, "group_reward_std": g.reward_std,
                    "sample_id": sample.id, "sample_position": sample.position,
                    "completion": sample.completion, "reward": sample.reward,
                    "reward_components": sample.reward_components, "tokens": sample.tokens,
                    "advantages": sample.advantages, "step_rewards": sample.step_rewards,
                    "step_end_indices": sample.step_end_indices,
                }
        last = (groups[-1].step, groups[-1].position)
        s.expunge_all()  # keep the session small


# ---- logs -----------------------------------------------------------------------------------


def append_log(s: Session, run_id: int, message: str) -> None:
    s.add(RunLog(run_id=run_id, message=message))
    s.flush()


def get_logs(s: Session, run_id: int, limit: int = 200) -> list[str]:
    """The last ``limit`` log lines of a run, oldest first."""
    rows = s.scalars(select(RunLog.message).where(RunLog.run_id == run_id).order_by(RunLog.id.desc()).limit(limit))
    return list(rows)[::-1]


# ---- workers --------------------------------------------------------------------------------


def report_worker(s: Session, name: str, queues: list[str], gpus: list[dict[str, Any]]) -> None:
    """Worker ``name`` (hostname:pid) is alive, consumes ``queues`` and has ``gpus`` ([{"name", "memory"}],
    memory in bytes; [] without a GPU): insert its row, or update it with seen_at now (one upsert)."""
    gpus = [{"name": str(gpu["name"]), "memory": int(gpu["memory"])} for gpu in gpus]
    upsert = {"sqlite": sqlite_insert, "postgresql": postgresql_insert}[s.get_bind().dialect.name]
    statement = upsert(Worker).values(name=name, queues=",".join(queues), gpus=gpus, seen_at=_now())
    statement = statement.on_conflict_do_update(
        index_elements=[Worker.name],
        set_={"queues": statement.excluded.queues, "gpus": statement.excluded.gpus,
              "seen_at": statement.excluded.seen_at},
    )
    s.execute(statement)


def live_workers(s: Session, within_seconds: float) -> list[dict[str, Any]]:
    """The workers that reported in the last ``within_seconds``, by name: ``{name, queues (list), gpus,
    seen_at}``."""
    since = _now() - timedelta(seconds=within_seconds)
    rows = s.scalars(select(Worker).where(Worker.seen_at >= since).order_by(Worker.name))
    return [{"name": w.name, "queues": [q for q in w.queues.split(",") if q], "gpus": w.gpus,
             "seen_at": _iso(w.seen_at)} for w in rows]
