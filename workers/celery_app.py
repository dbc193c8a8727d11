"""The Celery application shared by the dashboard (which only sends tasks, by name) and the workers.

Importing this module imports neither torch nor the engine: the task body imports them when it runs.
"""
from __future__ import annotations

from celery import Celery

from app.settings import get_settings

RUN_TASK = "grpo.run"


def make_celery() -> Celery:
    settings = get_settings()
    if settings.broker_url.startswith("sqla+sqlite"):
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    app = Celery("grpo_dashboard", broker=settings.broker_url)
    app.conf.update(
        task_default_queue=settings.queue,
        task_acks_late=True,  # a job whose worker dies is redelivered
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,  # one training job at a time per worker
        task_ignore_result=True,  # results live in the store, not in a result backend
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        include=["workers.tasks"],
    )
    if not settings.broker_url.startswith("sqla"):
        # Redis hands an unacknowledged job to another worker after this long; a GRPO run can hold its
        # GPU for many hours, so it must be longer than the longest run. (The SQLite broker passes
        # transport options to create_engine, which refuses this one.)
        app.conf.broker_transport_options = {"visibility_timeout": 7 * 24 * 3600}
    return app


celery_app = make_celery()
