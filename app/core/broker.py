"""The broker client: the Celery application shared by the dashboard and the workers, its queues, ``send_run``, the
one place that sends a run to the workers (by task name), and ``send_try``, a question tried by hand (its own queue,
``tries_queue``: a worker busy training never holds a try).

Importing this module imports neither torch nor the engine: the task (workers/tasks.py) imports them when
it runs.
"""

from __future__ import annotations

import time

from celery import Celery

from app.core.settings import get_settings

RUN_TASK = "grpo.run"
TRY_TASK = "grpo.try"
DEVICE_CLASSES = ("gpu", "cpu")


def queue_for(device: str, base: str) -> str:
    """The queue a run goes to: ``base`` for device 'auto' (any worker), ``base.gpu`` / ``base.cpu`` otherwise."""
    return base if device == "auto" else f"{base}.{device}"


def tries_queue(base: str) -> str:
    """The queue of questions tried by hand: ``base.tries``, served by workers started for it (``serve`` starts one
    beside its embedded worker; ``grpo-dashboard worker --queue base.tries`` elsewhere)."""
    return f"{base}.tries"


def worker_queues(base: str, device_class: str | None) -> list[str]:
    """The queues a worker consumes: ``base`` and its own class's (``device_class`` None: every class,
    for the embedded worker, the only one there is)."""
    classes = DEVICE_CLASSES if device_class is None else (device_class,)
    return [base] + [queue_for(c, base) for c in classes]


def prepare_broker() -> None:
    """Create the data directory where the embedded SQLite broker keeps its file. Called before connecting,
    not on import: importing this module creates nothing (a refused ``train`` leaves no data directory)."""
    settings = get_settings()
    if settings.broker_url.startswith("sqla+sqlite"):
        settings.data_dir.mkdir(parents=True, exist_ok=True)


def make_celery() -> Celery:
    settings = get_settings()
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


def declare_queues(names: list[str], attempts: int = 5) -> None:
    """Create the queues on the broker before any worker consumes them. On the SQLite broker two
    processes that create the same queue at once collide (a unique constraint fails and the loser
    stops); a process that declares first, retrying on a collision, takes that race away."""
    from kombu import Exchange, Queue

    prepare_broker()
    for name in names:
        for attempt in range(attempts):
            try:
                with celery_app.connection_for_write() as conn:  # a fresh session on each try
                    Queue(name, Exchange(name), routing_key=name, channel=conn.default_channel).declare()
                break
            except Exception:
                if attempt == attempts - 1:
                    raise
                time.sleep(0.2 * (attempt + 1))


def send_run(run_id: int, device: str) -> None:
    """Send run ``run_id`` to the queue of its ``device`` class, on the broker the settings name now. A broker
    that cannot be reached raises (kombu's error)."""
    settings = get_settings()
    prepare_broker()
    with celery_app.connection_for_write(settings.broker_url) as conn:
        celery_app.send_task(RUN_TASK, args=[run_id], queue=queue_for(device, settings.queue), connection=conn)


def send_try(try_id: int) -> None:
    """Send try ``try_id`` (app.store.tries) to the tries queue. A broker that cannot be reached raises."""
    settings = get_settings()
    prepare_broker()
    with celery_app.connection_for_write(settings.broker_url) as conn:
        celery_app.send_task(TRY_TASK, args=[try_id], queue=tries_queue(settings.queue), connection=conn)
