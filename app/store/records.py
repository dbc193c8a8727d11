"""What a run records besides its groups: per-step metrics and log lines, forgetting what a resumed run recorded
after the step it resumes from, and the newest row id of each record (what the dashboard's poll compares). Small
functions taking a Session, returning plain JSON-able values. The sampled groups and their samples are
``app.store.groups``.

Writes of a worker go through its lease (``runs.renew_lease``): a worker that lost the run's lease
records nothing more (``LeaseLost``).
"""

from __future__ import annotations

import functools
import math
from typing import Any

from sqlalchemy import bindparam, delete, func, select, update
from sqlalchemy.orm import Session

from app.store.models import EvalResult, Group, Metric, Run, RunLog
from app.store.runs import UPSERT, LeaseLost, renew_lease

# The tables a worker writes every step, for Core statements (no ORM unit of work on the hot path)
METRICS, RUNS = Metric.__table__, Run.__table__
_RUN_STEP = update(RUNS).where(RUNS.c.id == bindparam("run_id")).values(step=bindparam("step"))


def _finite_or_none(value: Any) -> float | None:
    """A metric as a JSON number: NaN / inf (a diverged run) become null."""
    value = float(value)
    return value if math.isfinite(value) else None


def truncate_after(s: Session, run_id: int, step: int) -> None:
    """Forget what a run recorded after ``step`` (training resumes from there and records it again)."""
    s.execute(delete(Metric).where(Metric.run_id == run_id, Metric.step > step))
    s.execute(delete(Group).where(Group.run_id == run_id, Group.step > step))
    s.execute(delete(EvalResult).where(EvalResult.run_id == run_id, EvalResult.step > step))
    s.execute(update(Run).where(Run.id == run_id).values(step=step))


# ---- metrics --------------------------------------------------------------------------------


def record_step(
    s: Session, run_id: int, step: int, iteration: int, metrics: dict[str, float], worker: str | None = None
) -> None:
    """Store the metrics of one step (replacing that step's row if a resumed job repeats it).

    ``worker`` given: the write also renews that worker's lease, and raises LeaseLost (the caller's
    transaction then rolls back) when it no longer holds it.
    """
    if worker is not None and not renew_lease(s, run_id, worker):
        raise LeaseLost(f"run {run_id}: worker {worker} no longer holds the lease; step {step} not recorded")
    values = {key: _finite_or_none(value) for key, value in metrics.items()}
    s.execute(
        _metrics_upsert(s.get_bind().dialect.name),
        {"run_id": run_id, "step": step, "iteration": iteration, "values": values},
    )
    s.execute(_RUN_STEP, {"run_id": run_id, "step": step})


@functools.cache
def _metrics_upsert(dialect: str):
    """INSERT ... ON CONFLICT DO UPDATE of one metrics row, built once per dialect (a worker runs it every step;
    building a statement costs more than running it)."""
    statement = UPSERT[dialect](METRICS).values(
        run_id=bindparam("run_id"), step=bindparam("step"), iteration=bindparam("iteration"), values=bindparam("values")
    )
    return statement.on_conflict_do_update(
        index_elements=[METRICS.c.run_id, METRICS.c.step],
        set_={"iteration": statement.excluded.iteration, "values": statement.excluded["values"]},
    )


def get_metrics(s: Session, run_id: int) -> list[dict[str, Any]]:
    """One dict per recorded step, by step: ``{"step", "iteration", **metrics}``."""
    rows = s.scalars(select(Metric).where(Metric.run_id == run_id).order_by(Metric.step))
    return [{"step": m.step, "iteration": m.iteration, **m.values} for m in rows]


# ---- logs -----------------------------------------------------------------------------------


def append_log(s: Session, run_id: int, message: str) -> None:
    """Add a line to the run's log."""
    s.add(RunLog(run_id=run_id, message=message))
    s.flush()


def get_logs(s: Session, run_id: int, limit: int = 200) -> list[str]:
    """The last ``limit`` log lines of a run, oldest first."""
    rows = s.scalars(select(RunLog.message).where(RunLog.run_id == run_id).order_by(RunLog.id.desc()).limit(limit))
    return list(rows)[::-1]


def latest_writes(s: Session) -> tuple[int, int, int]:
    """The newest row id of the metrics, the groups and the log lines: any of them grows when anything records a
    step, a group or a line. Three primary-key maxima, each read off its index."""
    return tuple(s.scalar(select(func.coalesce(func.max(table.id), 0))) for table in (Metric, Group, RunLog))
