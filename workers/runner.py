"""Turn a stored run into an engine run: re-read the row, train, record the outcome.

Used by the Celery task (workers/tasks.py) and by ``grpo-dashboard train`` (in the foreground).
Safe to call twice for the same run (a redelivered job): finished runs are skipped, steps and
groups are upserted.
"""
from __future__ import annotations

import logging
import traceback

from app import store
from app.db import session_scope
from app.settings import get_settings
from grpo_engine.config import validate_spec
from workers.recorder import DBRecorder

logger = logging.getLogger("grpo.worker")

FINISHED = ("completed", "failed", "cancelled")


def _one_line(exc: BaseException) -> str:
    """'ValueError: first line of the message', for the run's error field."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _finish(run_id: int, status: str, error: str | None = None, log: str | None = None) -> str:
    with session_scope() as s:
        if log:
            store.append_log(s, run_id, log)
        store.finish_run(s, run_id, status, error)
    logger.info("run %s %s%s", run_id, status, f": {error}" if error else "")
    return status


def execute_run(run_id: int, recorder: DBRecorder | None = None) -> str:
    """Run the stored run ``run_id`` to its end and return its final status.

    ``recorder`` defaults to a DBRecorder for the run (the CLI passes one that also draws a progress bar).
    Returns "missing" if there is no such run.
    """
    with session_scope() as s:
        run = store.get_run(s, run_id)
    if run is None:
        logger.error("run %s: no such run in the store; job dropped", run_id)
        return "missing"
    if run["status"] in FINISHED:
        logger.info("run %s is already %s; nothing to do", run_id, run["status"])
        return run["status"]
    if run["cancel_requested"]:  # cancelled before this worker picked it up (or before a redelivery)
        return _finish(run_id, "cancelled")

    recorder = recorder or DBRecorder(run_id)
    try:
        from grpo_engine.trainer import train  # torch is imported here, in the worker only

        spec = validate_spec(run["config"])
        with session_scope() as s:
            store.mark_running(s, run_id, spec.total_steps)
        train(spec, recorder, get_settings().cache_dir)
    except Exception as exc:
        return _finish(run_id, "failed", _one_line(exc), log=traceback.format_exc())
    except BaseException as exc:  # Ctrl-C or a hard worker shutdown: record it, then let it propagate
        _finish(run_id, "failed", f"Interrupted ({type(exc).__name__})", log=traceback.format_exc())
        raise

    if recorder.stop_reason == "cancel":
        return _finish(run_id, "cancelled")
    if recorder.stop_reason == "interrupt":
        with session_scope() as s:
            step = (store.get_run(s, run_id) or {}).get("step", 0)
        return _finish(run_id, "failed", f"Interrupted: the worker stopped at step {step} of {spec.total_steps}")
    return _finish(run_id, "completed")
