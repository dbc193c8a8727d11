"""The Celery tasks: run a stored GRPO run, given its id; try a question on a run's models, given the try's id.

A message carries only an id; the task re-reads everything else from the store. ``acks_late``: the message is
acknowledged when the job has ended, so a job whose worker died is delivered again.
"""

from __future__ import annotations

from app.core.broker import RUN_TASK, TRY_TASK, celery_app
from workers.runner import execute_run
from workers.tries import execute_try


@celery_app.task(name=RUN_TASK, acks_late=True)
def run_grpo(run_id: int) -> str:
    """Train run ``run_id`` and return its final status (completed / failed / cancelled)."""
    return execute_run(int(run_id))


@celery_app.task(name=TRY_TASK, acks_late=True)
def try_question(try_id: int) -> str:
    """Sample and score try ``try_id``'s outputs and return its status (done / failed / skipped)."""
    return execute_try(int(try_id))
