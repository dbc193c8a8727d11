"""The one Celery task: run a stored GRPO run, given its id.

The message carries only the run id; the task re-reads everything else from the store. ``acks_late``:
the message is acknowledged when the run has ended, so a job whose worker died is delivered again.
"""

from __future__ import annotations

from app.core.broker import RUN_TASK, celery_app
from workers.runner import execute_run


@celery_app.task(name=RUN_TASK, acks_late=True)
def run_grpo(run_id: int) -> str:
    """Train run ``run_id`` and return its final status (completed / failed / cancelled)."""
    return execute_run(int(run_id))
