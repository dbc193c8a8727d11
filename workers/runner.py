"""Turn a stored run into an engine run: claim the run's lease, train, record the outcome.

Used by the Celery task (workers/tasks.py) and by ``grpo-dashboard train`` (in the foreground).
Safe to call for the same run more than once (a redelivered or re-sent job): a finished run is
skipped, a run another live worker holds is left to it, and a run whose worker died is resumed from
its last checkpoint. A job stops at a step boundary when it is cancelled (status ``cancelled``),
when its worker shuts down (it pauses: back to ``queued``, and re-sent to the queue), or when its
lease was taken over by another worker (it leaves the run to that worker).
"""

from __future__ import annotations

import logging
import os
import socket
import traceback
from collections.abc import Callable
from enum import StrEnum

from app import store
from app.core import broker
from app.core.admission import admit
from app.core.run_status import RunStatus
from app.core.settings import get_settings
from app.store.db import session_scope
from grpo_engine.report.recorder import TrainResult, TrainStatus
from workers.distributed import run_processes
from workers.errors import one_line
from workers.recorder import DBRecorder, LeaseKeeper, interrupt, with_trackers
from workers.run_models import run_model_to_load

logger = logging.getLogger("grpo.worker")

WORKER_NAME = f"{socket.gethostname()}:{os.getpid()}"  # this process, as the lease names it


def _finish(
    run_id: int, status: RunStatus, error: str | None = None, log: str | None = None, worker: str | None = None
) -> RunStatus:
    """Record the end of a run. ``log`` (a failure's traceback, with this machine's paths) goes to this worker's
    own log; the run's log, which users read, says where it is."""
    if log:
        logger.error("run %s failed on worker %s:\n%s", run_id, worker, log)
    with session_scope() as s:
        if log:
            store.append_log(s, run_id, f"failed on worker {worker}: {error} (the traceback is in that worker's log)")
        store.finish_run(s, run_id, status, error, worker=worker)
    logger.info("run %s %s%s", run_id, status, f": {error}" if error else "")
    return status


def requeue_stale_runs(lease_seconds: float | None = None) -> list[int]:
    """Put back in the queue every run whose worker stopped renewing its lease (it died), and send
    each to its queue again; the next worker resumes it from its last checkpoint. Every worker calls
    this periodically. Returns the run ids requeued by this call."""
    lease = get_settings().lease_seconds if lease_seconds is None else lease_seconds
    with session_scope() as s:  # the send happens inside the transaction: if the broker fails, nothing changes
        requeued = store.requeue_stale_runs(s, lease)
        for run in requeued:
            store.append_log(
                s,
                run["run_id"],
                f"worker {run['worker']} stopped renewing its lease; the run is "
                "back in the queue and resumes from its last checkpoint",
            )
            broker.send_run(run["run_id"], run["config"].get("device", "auto"))
    for run in requeued:
        logger.warning("run %s: worker %s is gone; run requeued", run["run_id"], run["worker"])
    return [run["run_id"] for run in requeued]


def local_gpus() -> list[dict]:
    """This process's CUDA GPUs as torch sees them (after CUDA_VISIBLE_DEVICES): ``[{"name", "memory"}]``,
    memory in bytes; [] without one. Imports torch: worker only."""
    import torch

    if not torch.cuda.is_available():
        return []
    properties = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
    return [{"name": p.name, "memory": int(p.total_memory)} for p in properties]


def report_worker(queues: list[str], gpus: list[dict], worker: str = WORKER_NAME) -> None:
    """Tell the store this worker is alive, which queues it consumes and which GPUs it has (the dashboard
    checks at launch that a run's weights fit one of them)."""
    with session_scope() as s:
        store.report_worker(s, worker, queues, gpus)


class Delivery(StrEnum):
    """What a delivery of a run came to on this worker when the run did not end here (when it did: its RunStatus,
    completed, failed or cancelled). Strings, as Celery records a task's result."""

    PAUSED = "paused"  # this worker is shutting down: stopped after a step with a checkpoint, back in the queue
    HELD = "held"  # another worker holds the run's lease: this delivery is dropped
    LOST = "lost"  # another worker took the run over while this one trained it
    DEFERRED = "deferred"  # this worker was shutting down before it started: sent to the queue again
    MISSING = "missing"  # no such run in the store


def execute_run(
    run_id: int, make_recorder: Callable[..., DBRecorder] = DBRecorder, worker: str = WORKER_NAME
) -> RunStatus | Delivery:
    """Run the stored run ``run_id`` until it ends or pauses, and return what happened: its final RunStatus
    (completed, failed, cancelled), or a Delivery (paused, held, lost, deferred, missing).

    ``make_recorder`` builds the run's recorder once the lease is claimed, called as DBRecorder is:
    ``make_recorder(run_id, worker=..., lease_lost=..., background=True)``; the CLI passes one whose
    recorder also draws a progress bar.
    """
    settings = get_settings()
    with session_scope() as s:
        run = store.get_run(s, run_id)
        if run is None:
            logger.error("run %s: no such run in the store; job dropped", run_id)
            return Delivery.MISSING
        if run["status"] in store.FINISHED_STATUSES:
            logger.info("run %s is already %s; nothing to do", run_id, run["status"])
            return RunStatus(run["status"])
        if run["cancel_requested"]:  # cancelled before this worker picked it up (or before a redelivery)
            store.finish_run(s, run_id, RunStatus.CANCELLED)
            return RunStatus.CANCELLED
        if interrupt.is_set():  # this worker is shutting down: hand the job to the next worker
            broker.send_run(run_id, run["config"].get("device", "auto"))
            return Delivery.DEFERRED
        if not store.claim_run(s, run_id, worker, settings.lease_seconds):
            logger.info("run %s is held by worker %s; this delivery is dropped", run_id, run["worker"])
            return Delivery.HELD
        attempt = run["attempts"] + 1
        if attempt > 1:
            store.append_log(s, run_id, f"attempt {attempt}: worker {worker} takes the run over")

    with LeaseKeeper(run_id, worker, settings.lease_seconds / 4) as lease:
        recorder = make_recorder(run_id, worker=worker, lease_lost=lease.lost, background=True)
        try:
            try:
                recorder.phase("loading model")  # shown from the claim on: importing torch alone takes seconds
                from grpo_engine.train.trainer import train  # torch is imported here, in the worker only

                spec = admit(run["config"], settings)  # launch's checks again, with this machine's settings
                spec = run_model_to_load(spec, settings, recorder.log)  # run:<id>[@<step>]: that policy's directory
                if spec.devices > 1:  # data-parallel: the run's processes train and record; this one watches
                    result = run_processes(run_id, spec, worker, recorder)
                    recorder.stop_reason = result.stop_reason
                else:
                    with with_trackers(recorder, run_id, spec) as reporting:  # report_to: closed however train ends
                        result = train(spec, reporting, settings.cache_dir, checkpoint_dir=settings.run_dir(run_id))
            finally:
                recorder.close()  # everything recorded is in the store before the run's status changes
            if result.status == TrainStatus.FAILED:  # a data-parallel run's processes failed
                return _finish(run_id, RunStatus.FAILED, result.error, log=result.log, worker=worker)
        except store.LeaseLost:
            recorder.stop_reason = "lost"
            result = TrainResult(TrainStatus.STOPPED)
        except Exception as exc:
            return _finish(run_id, RunStatus.FAILED, one_line(exc), log=traceback.format_exc(), worker=worker)
        except BaseException as exc:  # a hard stop of this process: the run goes back to the queue
            with session_scope() as s:
                store.append_log(s, run_id, f"the worker stopped ({type(exc).__name__}); the run is back in the queue")
                if store.requeue_run(s, run_id, worker):
                    broker.send_run(run_id, run["config"].get("device", "auto"))
            raise

    if recorder.stop_reason == "lost":
        logger.warning("run %s: another worker took it over; this worker stops", run_id)
        return Delivery.LOST
    if recorder.stop_reason == "cancel" or result.status == TrainStatus.CANCELLED:
        return _finish(run_id, RunStatus.CANCELLED, worker=worker)
    if result.status == TrainStatus.PAUSED:
        with session_scope() as s:
            store.append_log(
                s,
                run_id,
                f"the worker is shutting down: paused after step {result.step}; the run is back in the queue",
            )
            if store.requeue_run(s, run_id, worker):
                broker.send_run(run_id, run["config"].get("device", "auto"))
        logger.info("run %s paused after step %s and requeued", run_id, result.step)
        return Delivery.PAUSED
    return _finish(run_id, RunStatus.COMPLETED, worker=worker)
