"""Datasets and models from the browser: uploading a dataset file (checked, stored under its content hash),
previewing the first rows of the dataset a run spec names, uploading a model into the models folder
(app.core.models_folder) and listing what the Launch form's model field offers."""

from __future__ import annotations

import re
import secrets
import shutil
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from app.core.models_folder import ModelUploadError, sha256_file, store_model
from app.core.models_folder import list_models as list_models_in
from app.core.paths import is_local_path, resolve_inside, spec_fields
from app.core.settings import get_settings
from app.service.api import ApiError
from app.service.run_models import trained_runs
from grpo_engine.data.data import FIELDS, check_dataset_file, load_dataset
from grpo_engine.spec.config import BUILTIN_DATASETS, MAX_TEXT, SpecError
from grpo_engine.spec.hub import cached_models

PREVIEW_ROWS = 5
BUILTINS = " and ".join(map(repr, BUILTIN_DATASETS))  # the built-in datasets, as a message names them
CHECKS_AT_ONCE = 2  # dataset files checked at the same time; more requests wait their turn
CACHED_CHECKS = 64  # checked files remembered, by (path, size, modification time, columns)
_checking = threading.BoundedSemaphore(CHECKS_AT_ONCE)
_checked: OrderedDict[tuple, tuple[int, list[dict]] | str] = OrderedDict()
_cache_lock = threading.Lock()


def checked_file(path: Path, name: str, fields: tuple[str, str, str] = FIELDS) -> tuple[int, list[dict]]:
    """(row count, first PREVIEW_ROWS rows) of a dataset file, checked as a stream (grpo_engine.data.data.check_dataset_file:
    bounded memory), at most CHECKS_AT_ONCE at a time, and remembered per (path, size, modification time, columns)
    so that previewing the same file again costs nothing; a refusal is a ValueError naming the file and line."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, fields, name)
    with _cache_lock:
        found = _checked.get(key)
        if found is not None:
            _checked.move_to_end(key)
    if found is None:
        with _checking:
            try:
                found = check_dataset_file(path, name=name, fields=fields, keep=PREVIEW_ROWS)
            except ValueError as e:
                found = str(e)
        with _cache_lock:
            _checked[key] = found
            while len(_checked) > CACHED_CHECKS:
                _checked.popitem(last=False)
    if isinstance(found, str):
        raise ValueError(found)
    return found[0], [dict(row) for row in found[1]]


SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def _safe_name(name: str) -> str:
    """A file name of letters, digits and ``._-`` only, at most 80 characters, its extension kept."""
    stem, suffix = Path(name).stem, Path(name).suffix.lower()
    stem = SAFE_NAME.sub("_", stem).strip("._-")[: 80 - len(suffix)] or "dataset"
    return stem + suffix


UPLOAD_DIGEST = 16  # hex digits of an uploaded dataset's SHA-256 before its name: the same file is kept once
UPLOADED = re.compile(rf"^[0-9a-f]{{{UPLOAD_DIGEST}}}-(?=.)")


def uploaded_name(dataset: str) -> str:
    """The last part of a dataset path, an uploaded file's digest taken off: the name the user gave the file.

    >>> uploaded_name("/data/uploads/c8454ba910d8fbef-word_problems.jsonl"), uploaded_name("openai/gsm8k")
    ('word_problems.jsonl', 'gsm8k')
    """
    return UPLOADED.sub("", dataset.rstrip("/").rsplit("/", 1)[-1]) or dataset


def upload_dataset(file: Any, remove_source: bool = False) -> dict:
    """Check an uploaded dataset file and keep it; returns ``{dataset, rows, preview}``.

    ``file`` is the path of the uploaded file, or Gradio's file dict (``{"path", "orig_name", ...}``).
    It is refused when larger than GRPO_MAX_UPLOAD_MB or when it does not read as a dataset file
    (grpo_engine.data.data.check_dataset_file: the message names the file and the line). A good file is stored
    as ``<data dir>/uploads/<sha256 prefix>-<safe name>``; ``dataset`` is that path, for the run spec;
    ``preview`` its first rows. ``remove_source``: delete the uploaded file afterwards, kept or refused (Gradio's
    cached copy of an upload: nothing else needs it).
    """
    source, name = _uploaded(file)
    try:
        return _store_upload(source, name, get_settings())
    finally:
        if remove_source:
            source.unlink(missing_ok=True)


def _uploaded(file: Any) -> tuple[Path, str]:
    """Where an uploaded file is, and the name the user knows it by (never a path; the extension is the file's):
    ``file`` is its path or Gradio's file dict (``{"path", "orig_name", ...}``)."""
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
    return source, name


def upload_model(file: Any, remove_source: bool = False) -> dict:
    """Keep an uploaded model in the models folder (``<data dir>/models``, always a path root); returns ``{model,
    name, kind, size}``: ``model`` the stored path, for a run spec's ``model``; ``kind`` 'gguf' or 'directory'.

    ``file`` as for :func:`upload_dataset`: a .gguf file, or a .zip of a model directory (config.json,
    .safetensors weights, tokenizer files). Refused, naming the file and why, beyond GRPO_MAX_MODEL_UPLOAD_MB (a
    zip: also unpacked) and for a zip whose members escape its folder, are links, or that is damaged
    (app.core.models_folder.store_model); nothing is left in the models folder then. ``remove_source``: delete the
    uploaded file afterwards."""
    source, name = _uploaded(file)
    settings = get_settings()
    cap_words = f"{settings.max_model_upload_mb:g} MiB a model may be (GRPO_MAX_MODEL_UPLOAD_MB)"
    try:
        return store_model(source, name, settings.models_dir, settings.max_model_upload_bytes, cap_words)
    except ModelUploadError as e:
        raise ApiError(str(e)) from None
    finally:
        if remove_source:
            source.unlink(missing_ok=True)


def list_models() -> dict:
    """What the Launch form's model field offers: ``{models_folder, local, runs, hub}``: ``local`` the models folder's
    models (app.core.models_folder.list_models: ``{name, model, kind, size}``, kind 'directory' or 'gguf'), ``runs``
    the runs whose policy a run can start from (app.service.run_models.trained_runs: ``{model: 'run:<id>', name}``
    for a completed run's trained policy, ``run:<id>@<step>`` for a kept checkpoint's), ``hub`` the model ids in this machine's Hugging Face cache (grpo_engine.spec.hub)."""
    folder = get_settings().models_dir
    return {
        "models_folder": str(folder),
        "local": list_models_in(folder),
        "runs": trained_runs(),
        "hub": cached_models(),
    }


def _store_upload(source: Path, name: str, settings) -> dict:
    """Check an uploaded file (size, then content) and keep it under a name its content decides."""
    size = source.stat().st_size
    if size > settings.max_upload_bytes:
        raise ApiError(
            f"{name}: the file is {size / 2**20:.2f} MiB, larger than the {settings.max_upload_mb:g} MiB "
            "an upload may be (GRPO_MAX_UPLOAD_MB)"
        )
    try:
        count, first = checked_file(source, name)
    except ValueError as e:
        raise ApiError(str(e)) from None

    settings.uploads_dir.mkdir(parents=True, exist_ok=True)
    stored = settings.uploads_dir / f"{sha256_file(source)[:UPLOAD_DIGEST]}-{_safe_name(name)}"
    if not stored.exists():
        partial = stored.with_name(f".{stored.name}.{secrets.token_hex(4)}.partial")
        shutil.copyfile(source, partial)
        partial.replace(stored)  # a reader never sees a half-written file; the same file uploaded twice is kept once
    return {"dataset": str(stored), "rows": count, "preview": first}


def read_by_the_worker(dataset: str) -> bool:
    """Whether only the worker reads this dataset, so it is not previewed here: a Hugging Face id or a local dataset
    directory (not a built-in set or a dataset file).

    >>> [read_by_the_worker(d) for d in ("openai/gsm8k", "builtin-word-problems", "/data/train.jsonl")]
    [True, False, False]
    """
    return dataset not in BUILTIN_DATASETS and (not is_local_path(dataset) or Path(dataset).expanduser().is_dir())


def preview_dataset(
    dataset: Any, question_field: Any = None, answer_field: Any = None, solution_field: Any = None
) -> dict:
    """The first rows of the dataset a run spec names, as the run will read them; returns
    ``{dataset, rows, preview}`` like /upload_dataset. The built-in dataset, or a local file (inside
    GRPO_PATH_ROOTS, read and checked from the columns the ``*_field`` keys name, by default question,
    answer, solution: a bad file is refused naming the file and line). A Hugging Face id is not
    previewed (the worker resolves it): refused with a message saying so."""
    fields = spec_fields(
        {"question_field": question_field, "answer_field": answer_field, "solution_field": solution_field}
    )
    if not isinstance(dataset, str) or not dataset.strip():
        raise ApiError(f"dataset: give a built-in name ({BUILTINS}), or the path of a .jsonl, .csv or .parquet file")
    dataset = dataset.strip()
    if len(dataset) > MAX_TEXT or "\x00" in dataset:
        raise ApiError(f"dataset: must be at most {MAX_TEXT} characters, with no NUL character")
    if dataset in BUILTIN_DATASETS:
        train, heldout = load_dataset(dataset)
        return {"dataset": dataset, "rows": len(train) + len(heldout), "preview": train[:PREVIEW_ROWS]}
    if not is_local_path(dataset):
        raise ApiError(
            f"dataset: {dataset!r} is not a local file; only local files and the built-in {BUILTINS} are previewed"
        )
    try:
        path = resolve_inside("dataset", dataset, get_settings().path_roots)
    except SpecError as e:
        raise ApiError(str(e)) from None
    if path.is_dir():
        raise ApiError(
            f"dataset: {dataset!r} is a dataset directory; only files and the built-in {BUILTINS} are previewed"
        )
    try:
        count, first = checked_file(path, dataset, fields)  # read once: its check and its preview
    except ValueError as e:
        raise ApiError(f"dataset: {e}") from None
    return {"dataset": dataset, "rows": count, "preview": first}
