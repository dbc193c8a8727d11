"""``grpo-dashboard worker``: a Celery worker that runs training jobs, one at a time (one per GPU
machine in production; ``serve`` starts one with ``--embedded``).

Besides Celery's loop it reports itself (queues, GPUs) to the store and requeues runs whose worker
died, on a thread of its own; on shutdown the running job pauses at its next step. torch is imported
only when this command runs.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time

from app.core.auth import mask_url
from app.core.settings import get_settings

WORKER_STOP_SECONDS = 30  # how long `serve` waits for its worker to stop before killing it

HELP = "a Celery worker that runs training jobs, one at a time"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--queue",
        help="comma-separated queues to consume (default: GRPO_QUEUE (else 'grpo') and "
        "GRPO_QUEUE.gpu on a machine with a CUDA GPU, GRPO_QUEUE.cpu on one without)",
    )
    parser.add_argument("--loglevel", default="INFO", help="Celery log level (default INFO)")
    parser.add_argument(
        "--embedded",
        action="store_true",
        help="started by `serve`: exit with the parent process, stop a running job on shutdown",
    )


def _exit_with_parent() -> None:
    """Embedded worker: once the dashboard that started us is gone (even SIGKILLed), shut down."""
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGTERM)  # Celery's warm shutdown; the running job stops at its next step
    time.sleep(WORKER_STOP_SECONDS)
    os._exit(1)


def _interrupt_running_job(**kwargs) -> None:
    """The worker is shutting down: the running job pauses at its next step and goes back to the queue."""
    from workers.recorder import interrupt

    interrupt.set()


def _requeue_orphaned_runs() -> None:
    """Embedded worker: runs still 'running' were left by an earlier embedded worker that was killed
    (it is the only worker of its store): back to the queue at once, to resume from their checkpoints."""
    from workers.runner import requeue_stale_runs

    requeued = requeue_stale_runs(lease_seconds=0)
    if requeued:
        print(f"grpo-dashboard worker: resuming runs left running: {requeued}", flush=True)


def _watch_leases(period: float, queues: list[str], trains: bool) -> None:
    """Report this worker (its queues and GPUs) to the store now, then every ``period`` seconds report it
    again and requeue runs whose worker stopped renewing its lease (it died). Runs in its own thread:
    listing the GPUs imports torch, which the worker's start need not wait for. A worker that only answers tries
    (``trains`` False) reports no GPUs (launch places no run on it) and imports torch at its first try."""
    import logging

    from workers.runner import local_gpus, report_worker, requeue_stale_runs

    logger = logging.getLogger("grpo.worker")
    try:
        gpus = local_gpus() if trains else []
    except Exception:  # a broken CUDA install: this worker counts as one without a GPU
        logger.warning("could not list the GPUs", exc_info=True)
        gpus = []
    while True:
        try:
            report_worker(queues, gpus)
        except Exception:
            logger.warning("could not report this worker to the store", exc_info=True)
        time.sleep(period)
        try:
            requeue_stale_runs()
        except Exception:  # the store or broker hiccuped: try again next period
            logger.warning("could not check for stale runs", exc_info=True)


def _device_class() -> str:
    """'gpu' on a machine where torch sees a CUDA device, else 'cpu' (imports torch: worker only)."""
    import torch

    return "gpu" if torch.cuda.is_available() else "cpu"


def run(args: argparse.Namespace) -> int:
    from celery.signals import worker_shutting_down

    from app.core.broker import celery_app, declare_queues, tries_queue, worker_queues
    from app.store import db

    settings = get_settings()
    if settings.worker_memory_gb:
        from workers.errors import limit_memory

        limit_memory(settings.worker_memory_gb)
        print(
            f"grpo-dashboard worker: memory capped at {settings.worker_memory_gb:g} GB (GRPO_WORKER_MEMORY_GB)",
            flush=True,
        )
    db.upgrade_database()
    if args.queue:
        queues = args.queue
    else:  # its device class's queue and the one any worker takes; the embedded worker, the only one, takes all
        queues = ",".join(worker_queues(settings.queue, None if args.embedded else _device_class()))
    print(
        f"grpo-dashboard worker: queues {queues}; store {mask_url(settings.database_url)}; "
        f"broker {mask_url(settings.broker_url)}; checkpoints in {settings.checkpoint_dir}",
        flush=True,
    )
    declare_queues(queues.split(","))
    trains = queues.split(",") != [tries_queue(settings.queue)]  # not a worker that only answers tries
    if args.embedded:
        if trains:
            _requeue_orphaned_runs()
        threading.Thread(target=_exit_with_parent, name="exit-with-parent", daemon=True).start()
    worker_shutting_down.connect(_interrupt_running_job, weak=False)
    threading.Thread(
        target=_watch_leases,
        args=(settings.lease_seconds / 4, queues.split(","), trains),
        name="lease-watch",
        daemon=True,
    ).start()
    celery_app.worker_main(
        [
            "worker",
            "--pool=solo",  # the job runs in the worker's main process: one training job at a time, no fork of torch
            "--concurrency=1",
            "-Q",
            queues,
            f"--loglevel={args.loglevel}",
            f"--hostname=grpo-{os.getpid()}@%h",  # unique per process, so several workers on one machine coexist
            "--without-gossip",
            "--without-mingle",  # workers do not talk to each other
        ]
    )
    return 0
