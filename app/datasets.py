"""Datasets from the browser: uploading a file (checked, stored under its content hash) and previewing the first
rows of the dataset a run spec names."""
from __future__ import annotations

import hashlib
import re
import secrets
import shutil
from pathlib import Path
from typing import Any

from app.api import ApiError
from app.paths import is_local_path, resolve_inside, spec_fields
from app.settings import get_settings
from grpo_engine.builtin_task import builtin_examples
from grpo_engine.config import BUILTIN_DATASET, MAX_TEXT, SpecError
from grpo_engine.data import read_dataset_file

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
    if len(dataset) > MAX_TEXT or "\x00" in dataset:
        raise ApiError(f"dataset: must be at most {MAX_TEXT} characters, with no NUL character")
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
