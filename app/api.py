"""The dashboard's API: plain functions, JSON in and JSON out.

The Gradio endpoints (app/ui.py) are thin wrappers around these, so the same checks
apply to the browser form and to ``gradio_client``. Bad input raises :class:`ApiError`
with a message meant for the caller (a bad run spec names the key).

A launch writes the run row first (status ``queued``) and then sends the job to the
broker by task name, so this process never imports the engine or torch.
"""
from __future__ import annotations

import json
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

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


def list_groups(run_id: Any, step: Any = None, order: Any = None) -> list[dict]:
    """Groups sampled at ``step`` (None or "": the latest step that has groups), sorted by ``order``:
    "position" (sampling order, the default), "spread" (reward std, largest first), "mean" (reward mean,
    highest first) or "mean_asc"."""
    run_id = _as_id(run_id)
    step = None if step is None or step == "" else _as_id(step, "step")
    order = order or "position"
    if order not in store.GROUP_ORDERS:
        raise ApiError(f"order must be one of {', '.join(store.GROUP_ORDERS)}, got {order!r}")
    with session_scope() as s:
        _require_run(s, run_id)
        return store.list_groups(s, run_id, step, order)


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


def compare_runs(run_ids: Any) -> dict:
    """Several runs side by side: ``{runs: [get_run each], differing_keys: [...], metrics: {"<run_id>": [...]}}``.

    ``differing_keys`` are the run-spec keys whose values are not the same in every run (``name`` aside).
    """
    if isinstance(run_ids, str):
        run_ids = [x for x in run_ids.replace(",", " ").split() if x]
    if not isinstance(run_ids, (list, tuple)) or not run_ids:
        raise ApiError(f"run_ids must be a non-empty list of run ids, got {run_ids!r}")
    ids = list(dict.fromkeys(_as_id(r) for r in run_ids))  # order kept, duplicates dropped
    with session_scope() as s:
        runs = [_require_run(s, run_id) for run_id in ids]
        metrics = {str(run_id): store.get_metrics(s, run_id) for run_id in ids}
    keys = sorted({k for r in runs for k in r["config"]} - {"name"})
    differing = [k for k in keys if len({json.dumps(r["config"].get(k), sort_keys=True) for r in runs}) > 1]
    return {"runs": runs, "differing_keys": differing, "metrics": metrics}


EXPORT_KINDS = ("parquet", "csv", "config")


def export_run(run_id: Any, kind: Any = "parquet") -> str:
    """Write a run's export to a file and return its path: every recorded sample as Parquet or CSV
    (one row per sample; tokens, advantages and step data as lists in Parquet, JSON text in CSV), or
    the run's config as JSON (``kind`` "config") that /launch_run takes back as it is."""
    run_id = _as_id(run_id)
    kind = kind or "parquet"
    if kind not in EXPORT_KINDS:
        raise ApiError(f"kind must be one of {', '.join(EXPORT_KINDS)}, got {kind!r}")
    out_dir = Path(tempfile.gettempdir()) / "grpo-dashboard-exports"
    out_dir.mkdir(parents=True, exist_ok=True)
    with session_scope() as s:
        run = _require_run(s, run_id)
        if kind == "config":
            path = out_dir / f"run-{run_id}-config.json"
            path.write_text(json.dumps(run["config"], indent=2, sort_keys=True) + "\n", encoding="utf-8")
            return str(path)
        rows = list(store.iter_sample_rows(s, run_id))
    frame = pd.DataFrame(rows, columns=SAMPLE_COLUMNS)
    path = out_dir / f"run-{run_id}-groups.{kind}"
    tmp = path.with_suffix(f".{kind}.tmp")
    if kind == "parquet":
        frame.to_parquet(tmp, index=False)
    else:
        for column in ("reward_components", "tokens", "advantages", "step_rewards", "step_end_indices"):
            frame[column] = [None if v is None else json.dumps(v) for v in frame[column]]
        frame.to_csv(tmp, index=False)
    tmp.replace(path)  # a reader never sees a half-written file
    return str(path)


SAMPLE_COLUMNS = ["run_id", "step", "group_id", "group_position", "prompt", "reference", "group_reward_mean",
                  "group_reward_std", "sample_id", "sample_position", "completion", "reward", "reward_components",
                  "tokens", "advantages", "step_rewards", "step_end_indices"]
