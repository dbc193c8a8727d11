"""The dashboard's API: plain functions, JSON in and JSON out.

The Gradio endpoints (app/ui.py) are thin wrappers around these, so the same checks
apply to the browser form and to ``gradio_client``. Bad input raises :class:`ApiError`
with a message meant for the caller (a bad run spec names the key).

A launch writes the run row first (status ``queued``) and then sends the job to the
broker by task name, so this process never imports the engine or torch.
"""
from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from kombu.utils.url import maybe_sanitize_url

from app import store
from app.db import session_scope
from app.settings import get_settings
from grpo_engine.config import SpecError, validate_spec
from workers.celery_app import RUN_TASK, celery_app


class ApiError(ValueError):
    """A request was refused; the message says why."""


def _as_id(value: Any, what: str = "run_id") -> int:
    """Accept 12, 12.0 and "12" (clients send ids in all three shapes)."""
    if isinstance(value, bool):
        raise ApiError(f"{what} must be an integer, got {value!r}")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise ApiError(f"{what} must be an integer, got {value!r}")


def _require_run(s, run_id: int) -> dict:
    run = store.get_run(s, run_id)
    if run is None:
        raise ApiError(f"run {run_id} not found")
    return run


def _default_name(model: str) -> str:
    """'<model>-<YYYYmmdd-HHMMSS>', using the last part of a model id or path."""
    short = model.rstrip("/").rsplit("/", 1)[-1] or "run"
    return f"{short}-{datetime.now(timezone.utc).strftime('%Y%m%d-%H%M%S')}"


def launch_run(spec: dict | str | None) -> dict:
    """Validate a run spec, store the run (queued) and send it to the workers.

    ``spec`` is a JSON object, or its text. Returns ``{run_id, status}``.
    """
    # 1. parse and validate (missing keys take defaults; a bad key is named)
    if isinstance(spec, str):
        try:
            spec = json.loads(spec) if spec.strip() else {}
        except json.JSONDecodeError as e:
            raise ApiError(f"the run spec is not valid JSON: {e}") from None
    try:
        config = validate_spec(spec).to_dict()
    except SpecError as e:
        raise ApiError(str(e)) from None
    config["name"] = config["name"] or _default_name(config["model"])

    # 2. the row comes first, so a worker that picks the job up finds it
    settings = get_settings()
    with session_scope() as s:
        run_id = store.create_run(s, config, config["name"])

    # 3. enqueue by name on the broker the settings name now
    try:
        with celery_app.connection_for_write(settings.broker_url) as conn:
            celery_app.send_task(RUN_TASK, args=[run_id], queue=settings.queue, connection=conn)
    except Exception as e:  # any broker failure: the run can never start
        error = f"could not reach the broker at {maybe_sanitize_url(settings.broker_url)}: {e}"
        with session_scope() as s:
            store.finish_run(s, run_id, "failed", error=error)
        raise ApiError(f"run {run_id} failed: {error}") from e
    return {"run_id": run_id, "status": "queued"}


def list_runs() -> list[dict]:
    """Every run, newest first."""
    with session_scope() as s:
        return store.list_runs(s)


def get_run(run_id: Any) -> dict:
    """One run: status, config, progress, error and timestamps."""
    run_id = _as_id(run_id)
    with session_scope() as s:
        return _require_run(s, run_id)


def get_metrics(run_id: Any) -> list[dict]:
    """Per-step metrics of a run, ordered by step."""
    run_id = _as_id(run_id)
    with session_scope() as s:
        _require_run(s, run_id)
        return store.get_metrics(s, run_id)


def get_logs(run_id: Any, limit: int = 200) -> list[str]:
    """The last ``limit`` log lines of a run, oldest first."""
    run_id = _as_id(run_id)
    with session_scope() as s:
        _require_run(s, run_id)
        return store.get_logs(s, run_id, limit)


def group_steps(run_id: Any) -> list[int]:
    """Steps of a run that have recorded groups, ascending."""
    run_id = _as_id(run_id)
    with session_scope() as s:
        _require_run(s, run_id)
        return store.group_steps(s, run_id)


def list_groups(run_id: Any, step: Any = None) -> list[dict]:
    """Groups sampled at ``step`` (None or "": the latest step that has groups)."""
    run_id = _as_id(run_id)
    step = None if step is None or step == "" else _as_id(step, "step")
    with session_scope() as s:
        _require_run(s, run_id)
        return store.list_groups(s, run_id, step)


def get_group(group_id: Any) -> dict:
    """One group with its G samples: tokens, rewards and per-token advantages."""
    group_id = _as_id(group_id, "group_id")
    with session_scope() as s:
        group = store.get_group(s, group_id)
    if group is None:
        raise ApiError(f"group {group_id} not found")
    return group


def cancel_run(run_id: Any) -> dict:
    """Cancel a run: a queued run at once, a running one at its next step boundary."""
    run_id = _as_id(run_id)
    with session_scope() as s:
        _require_run(s, run_id)
        return store.request_cancel(s, run_id)
