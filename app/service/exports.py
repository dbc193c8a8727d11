"""Exports of a run: its recorded samples (Parquet, CSV), its config (JSON) and its trained policy (a zip).

Each export is written to a fresh directory inside this process's own temporary directory (mode 0700, deleted at
exit), by a create that refuses an existing file or a link, so no other user or dashboard on the host can plant
or read a file in its way; exports are deleted an hour after they were written.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
import time
import zipfile
from functools import lru_cache
from pathlib import Path
from typing import Any

import pandas as pd

from app import store
from app.service.api import ApiError, as_id, require_run
from app.store.db import session_scope
from app.core.run_status import RunStatus
from app.core.settings import get_settings

EXPORT_KINDS = ("parquet", "csv", "config", "model", "adapter")
POLICY_KINDS = ("model", "adapter")  # the trained policy: merged model, or the LoRA adapter alone


def _export_policy(run: dict, kind: str, out_dir: Path) -> str:
    """Zip the run's final policy directory (``<GRPO_CHECKPOINT_DIR>/run-<id>/final/<kind>``, written by
    the worker when the run completed) and return the zip's path."""
    run_id = run["run_id"]
    if kind == "adapter" and not run["config"].get("lora_rank"):
        raise ApiError(f"run {run_id} trained every weight (lora_rank 0): it has no adapter; export 'model'")
    source = get_settings().run_dir(run_id) / "final" / kind
    if not source.is_dir():
        if run["status"] != RunStatus.COMPLETED:
            raise ApiError(
                f"run {run_id} has no final policy: it is saved when the run completes (status {run['status']})"
            )
        raise ApiError(
            f"run {run_id}: its final policy is not in this dashboard's checkpoint directory "
            "(GRPO_CHECKPOINT_DIR must be a directory the workers and the dashboard share)"
        )
    path = out_dir / f"run-{run_id}-{kind}.zip"
    with _create(path) as out, zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as archive:
        for file in sorted(source.rglob("*")):  # safetensors hardly compress
            if file.is_file():
                archive.write(file, Path(f"run-{run_id}-{kind}") / file.relative_to(source))
    return str(path)


EXPORT_KEEP_SECONDS = 3600  # an export's file is deleted this long after it was written


@lru_cache(maxsize=1)
def _exports_root() -> Path:
    """This process's own directory for exports (mode 0700, a fresh name: no other user or dashboard on the
    host can plant files in it), deleted when the process exits."""
    root = Path(tempfile.mkdtemp(prefix="grpo-dashboard-exports-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root


def _export_dir() -> Path:
    """A fresh directory for one export (so concurrent exports never share a file); older ones are deleted."""
    root = _exports_root()
    now = time.time()
    for old in root.iterdir():
        if now - old.stat().st_mtime > EXPORT_KEEP_SECONDS:
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(dir=root))


def _create(path: Path):
    """A new file at ``path`` for writing: created here or refused (O_EXCL), never through a link (O_NOFOLLOW)."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600), "wb")


def export_run(run_id: Any, kind: Any = "parquet") -> str:
    """Write a run's export to a file and return its path: every recorded sample as Parquet or CSV
    (one row per sample; tokens, advantages and step data as lists in Parquet, JSON text in CSV),
    the run's config as JSON (``kind`` "config") that /launch_run takes back as it is, or the trained
    policy of a completed run as a zip of a Hugging Face model directory (safetensors): "model" (LoRA
    merged into the base) or "adapter" (the LoRA adapter alone, for peft)."""
    run_id = as_id(run_id)
    kind = kind or "parquet"
    if kind not in EXPORT_KINDS:
        raise ApiError(f"kind must be one of {', '.join(EXPORT_KINDS)}, got {kind!r}")
    out_dir = _export_dir()
    with session_scope() as s:
        run = require_run(s, run_id)
        if kind == "config":
            path = out_dir / f"run-{run_id}-config.json"
            with _create(path) as out:
                out.write((json.dumps(run["config"], indent=2, sort_keys=True) + "\n").encode("utf-8"))
            return str(path)
        if kind in POLICY_KINDS:
            return _export_policy(run, kind, out_dir)
        rows = list(store.iter_sample_rows(s, run_id))
    frame = pd.DataFrame(rows, columns=list(store.EXPORT_COLUMNS))
    path = out_dir / f"run-{run_id}-groups.{kind}"
    if kind == "csv":
        for column in (
            "reward_components",
            "tokens",
            "advantages",
            "step_rewards",
            "step_end_indices",
            "step_labels",
            "step_shares",
        ):
            frame[column] = [None if v is None else json.dumps(v) for v in frame[column]]
    with _create(path) as out:
        if kind == "parquet":
            frame.to_parquet(out, index=False)
        else:
            out.write(frame.to_csv(index=False).encode("utf-8"))
    return str(path)
