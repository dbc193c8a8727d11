"""What users do to their runs: rename, notes and tags, archive, delete; and the newest metrics of many runs at
once, for the Runs table. Small functions taking a Session (the caller owns the transaction).

Checks of the values (lengths, NUL characters, tag syntax) are the caller's (app.service.manage_api); these functions
store what they are given. Deleting a run deletes every row under it through the foreign keys' ON DELETE
CASCADE (SQLite enforces it: app.store.db turns ``foreign_keys`` on for every connection).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, delete, or_, select, update
from sqlalchemy.orm import Session

from app.core.run_status import RunStatus
from app.store.models import Metric, Run
from app.store.runs import raise_high_water

RUNS_PER_QUERY = 200  # runs per metrics_after query: SQLite parses an OR of n terms n levels deep (at most 1000)


def rename_run(s: Session, run_id: int, name: str) -> bool:
    """Give a run a new name, in its row and in its stored run spec (so an exported config carries it).
    False when there is no such run."""
    run = s.get(Run, run_id)
    if run is None:
        return False
    run.name = name
    run.config = {**run.config, "name": name}  # a new dict: the JSON column is saved when reassigned
    s.flush()
    return True


def annotate_run(s: Session, run_id: int, notes: str | None = None, tags: list[str] | None = None) -> bool:
    """Set a run's notes and tags (a list of tags without commas); None leaves that one as it is.
    False when there is no such run."""
    values: dict[str, Any] = {}
    if notes is not None:
        values["notes"] = notes
    if tags is not None:
        values["tags"] = ",".join(tags)
    if not values:
        return s.scalar(select(Run.id).where(Run.id == run_id)) is not None
    return s.execute(update(Run).where(Run.id == run_id).values(**values)).rowcount == 1


def set_archived(s: Session, run_id: int, archived: bool) -> bool:
    """Archive a run (the Runs table hides it unless asked) or bring it back. False when there is no such run."""
    return s.execute(update(Run).where(Run.id == run_id).values(archived=archived)).rowcount == 1


def delete_run(s: Session, run_id: int) -> str:
    """Delete a run with everything it recorded (metrics, groups and samples, log lines), unless it is running.

    Returns "deleted", "running" (refused: a worker is training it; cancel it first) or "missing". One
    conditional DELETE, so a worker that claims the run at the same moment either finds it gone or keeps it.
    """
    result = s.execute(delete(Run).where(Run.id == run_id, Run.status != RunStatus.RUNNING))
    if result.rowcount == 1:
        raise_high_water(s, run_id)  # in the delete's transaction: no later run takes its id
        return "deleted"
    return "running" if s.scalar(select(Run.id).where(Run.id == run_id)) is not None else "missing"


def metrics_after(s: Session, after: dict[int, int]) -> list[tuple[int, int, dict[str, Any]]]:
    """The metrics rows of several runs from a step on: ``after`` maps a run id to the first step wanted (0 or
    less: all of them); one query per RUNS_PER_QUERY runs. Returns ``(run_id, step, values)`` by run and step.

    The Runs table reads only the steps recorded since it last looked (app.service.manage_api.HeadlineMetrics), so a
    refresh reads a few rows however long the runs are.
    """
    found = []
    items = sorted(after.items())
    for start in range(0, len(items), RUNS_PER_QUERY):
        wanted = or_(
            *(
                and_(Metric.run_id == run_id, Metric.step >= step)
                for run_id, step in items[start : start + RUNS_PER_QUERY]
            )
        )
        rows = s.execute(
            select(Metric.run_id, Metric.step, Metric.values).where(wanted).order_by(Metric.run_id, Metric.step)
        )
        found += [(row.run_id, row.step, row.values or {}) for row in rows]
    return found
