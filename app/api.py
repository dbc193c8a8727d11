"""The dashboard's API: plain functions, JSON in and JSON out.

The Gradio endpoints (app/ui.py) are thin wrappers around these, so the same checks
apply to the browser form and to ``gradio_client``. Bad input raises :class:`ApiError`
with a message meant for the caller (a bad run spec names the key).

A launch writes the run row first (status ``queued``) and then sends the job to the
broker by task name, so this process never imports torch (the engine's modules it uses are torch-free).
"""
from __future__ import annotations

import hashlib
import json
import re
import secrets
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import pandas as pd

from app import store
from app.auth import mask_secrets, mask_url
from app.broker import queue_for, send_run
from app.db import session_scope
from app.paths import check_spec_paths, is_local_path, resolve_inside, spec_fields
from app.settings import get_settings
from grpo_engine.builtin_task import builtin_examples
from grpo_engine.config import BUILTIN_DATASET, SpecError, validate_spec
from grpo_engine.data import read_dataset_file
from grpo_engine.memory import MemoryEstimate, count_parameters, estimate_memory, lora_trainable_params, too_big_message


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


def launch_run(spec: dict | str | None) -> dict:
    """Validate a run spec, store the run (queued) and send it to the workers.

    ``spec`` is a JSON object, or its text. Returns ``{run_id, status}``. A refused spec (a bad value, a
    local path outside GRPO_PATH_ROOTS or unusable, a bad dataset file, a local model too big for every
    GPU of the live workers: :func:`check_fits_a_gpu`) stores nothing.
    """
    # 1. parse and validate (missing keys take defaults; a bad key is named)
    if isinstance(spec, str):
        try:
            spec = json.loads(spec) if spec.strip() else {}
        except json.JSONDecodeError as e:
            raise ApiError(f"the run spec is not valid JSON: {e}") from None
    settings = get_settings()
    try:
        config = validate_spec(spec).to_dict()
        check_spec_paths(config, settings.path_roots)  # local paths: inside the roots, usable
        check_fits_a_gpu(config)  # its weights fit a GPU of the live workers that would take it
    except SpecError as e:
        raise ApiError(str(e)) from None
    config["name"] = config["name"] or store.default_run_name(config["model"])

    # 2. the row comes first, so a worker that picks the job up finds it
    with session_scope() as s:
        run_id = store.create_run(s, config, config["name"])

    # 3. enqueue by name on the broker the settings name now
    try:
        send_run(run_id, config["device"])
    except Exception as e:  # any broker failure: the run can never start
        error = mask_secrets(f"could not reach the broker at {mask_url(settings.broker_url)}: {e}", settings)
        with session_scope() as s:
            store.finish_run(s, run_id, "failed", error=error)
        raise ApiError(f"run {run_id} failed: {error}") from e
    return {"run_id": run_id, "status": "queued"}


def _local_counts(value: str) -> tuple[int, list[tuple[int, int]]] | None:
    """count_parameters of a local model directory; None for the built-in model, a Hugging Face id, a
    directory without safetensors or one whose headers do not read (the worker reports that when it loads it)."""
    if not is_local_path(value):
        return None
    try:
        return count_parameters(Path(value).expanduser().resolve())
    except (OSError, ValueError):
        return None


def estimate_run_memory(config: dict, bf16: bool) -> MemoryEstimate | None:
    """The memory of a validated run spec's weights (grpo_engine.memory), when its ``model`` is a local
    directory with safetensors; else None. The reward model (reward: model) is the policy's weights when
    ``reward_model`` is empty, or a local directory; a Hugging Face id there is left out (the estimate is
    then a lower bound)."""
    counts = _local_counts(config["model"])
    if counts is None:
        return None
    params, linear = counts
    rank = config["lora_rank"]
    adapter = lora_trainable_params(linear, rank) if rank else 0
    rm_params = 0
    if config["reward"] == "model":
        rm_counts = _local_counts(config["reward_model"]) if config["reward_model"] else counts
        rm_params = rm_counts[0] if rm_counts else 0
    return estimate_memory(params + adapter, adapter if rank else params, lora=rank > 0, bf16=bf16,
                           rm_params=rm_params)


def check_fits_a_gpu(config: dict) -> None:
    """Refuse a run whose weights, gradients, optimizer state, reference and reward model (activations
    aside) need more memory than any GPU of the live workers that would take it has: SpecError naming
    ``model``, with the keys that make the run smaller.

    Live workers: those that reported within 2 x GRPO_LEASE_SECONDS and consume the run's queue. A
    ``device: gpu`` run is refused when none of their GPUs is big enough; a ``device: auto`` run only when
    every one of them has a GPU and none is big enough (a CPU worker may take it); a ``device: cpu`` run,
    or any run when no GPU worker is known, is accepted. bf16 unless ``precision`` is 'fp32' ('auto' is
    bf16 on a GPU). Only local model directories are measured, from their safetensors headers: the
    built-in model is tiny, and a Hugging Face id is not fetched here (it may be large, or the dashboard
    offline); the worker checks those when it loads them.
    """
    if config["device"] == "cpu":
        return
    settings = get_settings()
    queue = queue_for(config["device"], settings.queue)
    with session_scope() as s:
        workers = [w for w in store.live_workers(s, 2 * settings.lease_seconds) if queue in w["queues"]]
    gpu_workers = [w for w in workers if w["gpus"]]
    if not gpu_workers or (config["device"] == "auto" and len(gpu_workers) < len(workers)):
        return
    bf16 = config["precision"] != "fp32"
    need = estimate_run_memory(config, bf16)
    if need is None:
        return
    worker, gpu = max(((w["name"], g) for w in gpu_workers for g in w["gpus"]), key=lambda wg: wg[1]["memory"])
    if need.total > gpu["memory"]:
        where = f"the largest GPU of the live workers ({gpu['name']} on {worker})"
        raise SpecError("model", too_big_message(need, gpu["memory"], where, lora=config["lora_rank"] > 0, bf16=bf16))


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


EXPORT_KINDS = ("parquet", "csv", "config", "model", "adapter")
POLICY_KINDS = ("model", "adapter")  # the trained policy: merged model, or the LoRA adapter alone


def _export_policy(run: dict, kind: str, out_dir: Path) -> str:
    """Zip the run's final policy directory (``<GRPO_CHECKPOINT_DIR>/run-<id>/final/<kind>``, written by
    the worker when the run completed) and return the zip's path."""
    run_id = run["run_id"]
    if kind == "adapter" and not run["config"].get("lora_rank"):
        raise ApiError(f"run {run_id} trained every weight (lora_rank 0): it has no adapter; export 'model'")
    source = get_settings().checkpoint_dir / f"run-{run_id}" / "final" / kind
    if not source.is_dir():
        if run["status"] != "completed":
            raise ApiError(f"run {run_id} has no final policy: it is saved when the run completes (status {run['status']})")
        raise ApiError(f"run {run_id}: its final policy is not in this dashboard's checkpoint directory "
                       "(GRPO_CHECKPOINT_DIR must be a directory the workers and the dashboard share)")
    path = out_dir / f"run-{run_id}-{kind}.zip"
    tmp = path.with_suffix(".zip.tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as archive:  # safetensors hardly compress
        for file in sorted(source.rglob("*")):
            if file.is_file():
                archive.write(file, Path(f"run-{run_id}-{kind}") / file.relative_to(source))
    tmp.replace(path)
    return str(path)


def export_run(run_id: Any, kind: Any = "parquet") -> str:
    """Write a run's export to a file and return its path: every recorded sample as Parquet or CSV
    (one row per sample; tokens, advantages and step data as lists in Parquet, JSON text in CSV),
    the run's config as JSON (``kind`` "config") that /launch_run takes back as it is, or the trained
    policy of a completed run as a zip of a Hugging Face model directory (safetensors): "model" (LoRA
    merged into the base) or "adapter" (the LoRA adapter alone, for peft)."""
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
        if kind in POLICY_KINDS:
            return _export_policy(run, kind, out_dir)
        rows = list(store.iter_sample_rows(s, run_id))
    frame = pd.DataFrame(rows, columns=list(store.EXPORT_COLUMNS))
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




# ---- dataset upload ----------------------------------------------------------------------------

PREVIEW_ROWS = 5
SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def _safe_name(name: str) -> str:
    """A file name of letters, digits and ``._-`` only, at most 80 characters, its extension kept."""
    stem, suffix = Path(name).stem, Path(name).suffix.lower()
    stem = SAFE_NAME.sub("_", stem).strip("._-")[:80 - len(suffix)] or "dataset"
    return stem + suffix


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def upload_dataset(file: Any) -> dict:
    """Check an uploaded dataset file and keep it; returns ``{dataset, rows, preview}``.

    ``file`` is the path of the uploaded file, or Gradio's file dict (``{"path", "orig_name", ...}``).
    It is refused when larger than GRPO_MAX_UPLOAD_MB or when it does not read as a dataset file
    (grpo_engine.data.read_dataset_file: the message names the file and the line). A good file is stored
    as ``<data dir>/uploads/<sha256 prefix>-<safe name>``; ``dataset`` is that path, for the run spec;
    ``preview`` its first rows.
    """
    # 1. where the file is, and the name the user knows it by (never a path; the extension is the file's)
    if isinstance(file, dict):
        source, name = file.get("path"), file.get("orig_name")
    else:
        source, name = file, None
    if not isinstance(source, (str, Path)) or not str(source):
        raise ApiError("file must be an uploaded file (gradio_client: handle_file(path))")
    source = Path(source)
    name = Path(name or source.name).name
    if Path(name).suffix.lower() != source.suffix.lower():
        name = source.name
    if not source.is_file():
        raise ApiError(f"{name}: the uploaded file is missing")

    # 2. size, then content
    settings = get_settings()
    size = source.stat().st_size
    if size > settings.max_upload_bytes:
        raise ApiError(f"{name}: the file is {size / 2**20:.2f} MiB, larger than the {settings.max_upload_mb:g} MiB "
                       "an upload may be (GRPO_MAX_UPLOAD_MB)")
    try:
        rows = read_dataset_file(source, name=name)
    except ValueError as e:
        raise ApiError(str(e)) from None

    # 3. keep it under a name its content decides (the same file uploaded twice is kept once)
    settings.uploads_dir.mkdir(parents=True, exist_ok=True)
    stored = settings.uploads_dir / f"{_sha256(source)[:16]}-{_safe_name(name)}"
    if not stored.exists():
        partial = stored.with_name(f".{stored.name}.{secrets.token_hex(4)}.partial")
        shutil.copyfile(source, partial)
        partial.replace(stored)  # a reader never sees a half-written file
    return {"dataset": str(stored), "rows": len(rows), "preview": rows[:PREVIEW_ROWS]}


def preview_dataset(dataset: Any, question_field: Any = None, answer_field: Any = None,
                    solution_field: Any = None) -> dict:
    """The first rows of the dataset a run spec names, as the run will read them; returns
    ``{dataset, rows, preview}`` like /upload_dataset. The built-in dataset, or a local file (inside
    GRPO_PATH_ROOTS, read and checked from the columns the ``*_field`` keys name, by default question,
    answer, solution: a bad file is refused naming the file and line). A Hugging Face id is not
    previewed (the worker resolves it): refused with a message saying so."""
    fields = spec_fields({"question_field": question_field, "answer_field": answer_field,
                          "solution_field": solution_field})
    if not isinstance(dataset, str) or not dataset.strip():
        raise ApiError("dataset: give the built-in name, or the path of a .jsonl, .csv or .parquet file")
    dataset = dataset.strip()
    if dataset == BUILTIN_DATASET:
        train, heldout = builtin_examples()
        return {"dataset": dataset, "rows": len(train) + len(heldout), "preview": train[:PREVIEW_ROWS]}
    if not is_local_path(dataset):
        raise ApiError(f"dataset: {dataset!r} is not a local file; only local files and '{BUILTIN_DATASET}' are "
                       "previewed")
    try:
        path = resolve_inside("dataset", dataset, get_settings().path_roots)
    except SpecError as e:
        raise ApiError(str(e)) from None
    if path.is_dir():
        raise ApiError(f"dataset: {dataset!r} is a dataset directory; only files and '{BUILTIN_DATASET}' are previewed")
    try:
        rows = read_dataset_file(path, name=dataset, fields=fields)  # read once: its check and its preview
    except ValueError as e:
        raise ApiError(f"dataset: {e}") from None
    return {"dataset": dataset, "rows": len(rows), "preview": rows[:PREVIEW_ROWS]}

