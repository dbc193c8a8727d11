"""The words for where a run stands: ``RunStatus``, the only values of the store's ``runs.status`` column (a CHECK
constraint, migration 0009), shared by the store, the service, the web app and the workers.

A run is queued, then running; a worker that stops or dies puts it back to queued; it ends completed, failed or
cancelled. Members are strings (``RunStatus.QUEUED == "queued"``), so JSON, the API and the database read them as
such. Pure Python: no database, no torch.
"""

from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    QUEUED = "queued"  # waiting for a worker (again, after its worker stopped or died)
    RUNNING = "running"  # a worker holds its lease and trains it
    COMPLETED = "completed"  # every step trained, the policy saved
    FAILED = "failed"  # stopped by an error, recorded in the run's error and log
    CANCELLED = "cancelled"  # stopped by a user


ACTIVE_STATUSES = (RunStatus.QUEUED, RunStatus.RUNNING)  # a run that is not over
FINISHED_STATUSES = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)  # a run that is over
RUN_STATUS_CHECK = "status IN (" + ", ".join(f"'{s.value}'" for s in RunStatus) + ")"  # the constraint's SQL
