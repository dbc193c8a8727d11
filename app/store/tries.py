"""Questions tried by hand on a run's models (the ``tries`` table): the dashboard queues a try, a worker claims it,
samples and records its outputs, and the dashboard reads them back.

Life cycle, each change one conditional UPDATE (the dashboard giving up and a worker claiming can race):
  queued --claim_try--> running --finish_try--> done | failed
  queued | running --expire_try--> expired (the dashboard stopped waiting; a worker skips it, or drops its outputs)
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from app.store.models import EvalResult, Group, Try, utcnow
from app.store.runs import iso


def create_try(s: Session, run_id: int, request: dict[str, Any]) -> int:
    """Queue a try of ``request`` on run ``run_id``'s models; returns its id."""
    return s.execute(insert(Try).values(run_id=run_id, status="queued", request=request).returning(Try.id)).scalar_one()


def claim_try(s: Session, try_id: int) -> dict[str, Any] | None:
    """A worker takes try ``try_id``: its dict (as :func:`get_try`), now running; None where it is not queued any
    more (expired, or taken by another delivery)."""
    taken = s.execute(update(Try).where(Try.id == try_id, Try.status == "queued").values(status="running")).rowcount
    return get_try(s, try_id) if taken == 1 else None


def finish_try(s: Session, try_id: int, result: list[dict[str, Any]] | None = None, error: str | None = None) -> bool:
    """Record a running try's outputs (``result``) or its ``error``; False where it expired meanwhile."""
    done = update(Try).where(Try.id == try_id, Try.status == "running")
    values = {"status": "failed" if error else "done", "result": result, "error": error, "finished_at": utcnow()}
    return s.execute(done.values(**values)).rowcount == 1


def expire_try(s: Session, try_id: int) -> bool:
    """The dashboard stopped waiting for try ``try_id``: expired unless it has finished (then False)."""
    waiting = update(Try).where(Try.id == try_id, Try.status.in_(("queued", "running")))
    return s.execute(waiting.values(status="expired", finished_at=utcnow())).rowcount == 1


def get_try(s: Session, try_id: int) -> dict[str, Any] | None:
    """Try ``try_id``: ``{try_id, run_id, status, request, result, error, created_at, finished_at}``; None if
    missing."""
    t = s.scalar(select(Try).where(Try.id == try_id))
    if t is None:
        return None
    return {
        "try_id": t.id,
        "run_id": t.run_id,
        "status": t.status,
        "request": t.request,
        "result": t.result,
        "error": t.error,
        "created_at": iso(t.created_at),
        "finished_at": iso(t.finished_at),
    }


def run_questions(s: Session, run_id: int, limit: int) -> list[dict[str, str]]:
    """Questions of run ``run_id`` to try, at most ``limit``: its held-out questions as its latest evaluation recorded
    them, then the questions it trained on, first seen first; ``{question, reference, split}`` each (split "held-out"
    or "trained")."""
    latest = select(EvalResult.step).where(EvalResult.run_id == run_id).order_by(EvalResult.step.desc()).limit(1)
    heldout = s.execute(
        select(EvalResult.question, EvalResult.reference)
        .where(EvalResult.run_id == run_id, EvalResult.step == latest.scalar_subquery())
        .order_by(EvalResult.question_index)
        .limit(limit)
    ).all()
    trained = s.execute(
        select(Group.prompt, Group.reference).where(Group.run_id == run_id).order_by(Group.id).limit(4 * limit)
    ).all()
    seen: dict[str, dict[str, str]] = {}
    for rows, split in ((heldout, "held-out"), (trained, "trained")):
        for question, reference in rows:
            if len(seen) < limit and question not in seen:
                seen[question] = {"question": question, "reference": reference, "split": split}
    return list(seen.values())
