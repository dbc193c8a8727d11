"""Local paths in a run spec: only inside the configured roots, and only what a run can use.

A run spec's ``model``, ``reward_model`` and ``dataset`` are each a built-in name, a Hugging Face id
(``Qwen/Qwen2.5-0.5B-Instruct``, ``gsm8k``: the worker resolves it) or a local path. A local path
must resolve, after ``~``, ``..`` and symlinks, inside one of the roots (GRPO_PATH_ROOTS; by default
the data directory and the directory the process started in; the uploads directory and the models folder
``<data dir>/models`` always), so a run
spec cannot make a worker read files elsewhere on its machine. Then it must exist, a model directory
must hold a ``config.json`` (or the model is a .gguf file: a file starting with the GGUF magic, where the gguf
package that converts it is installed), a dataset file must read cleanly (grpo_engine.data.data.check_dataset_file, from
the spec's question / answer / solution columns), and a dataset directory (a Hugging Face dataset saved
locally, read by the ``datasets`` library) must hold data files.

The dashboard checks at launch (app.service.api.launch_run) and the worker checks again before training,
with its own roots. Pure Python: no torch, no Gradio.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from grpo_engine.data.data import check_dataset_file
from grpo_engine.rewards.reward_functions import check_custom_allowed, file_reference
from grpo_engine.spec.config import SpecError, is_gguf, is_local_path  # noqa: F401 (is_local_path: app.service.api uses it too)
from grpo_engine.spec.gguf_header import is_gguf_file

PATH_KEYS = (
    "model",
    "reward_model",
    "label_completer",
    "dataset",
    "rm_data",
)  # the run-spec keys that may name a local path
DATA_DIR_SUFFIXES = (".jsonl", ".csv", ".parquet", ".arrow")  # what a Hugging Face dataset directory holds


def spec_fields(config: dict) -> tuple[str, str, str]:
    """The dataset columns a run spec reads the question, answer and solution from."""
    return (
        config.get("question_field") or "question",
        config.get("answer_field") or "answer",
        config.get("solution_field") or "solution",
    )


def _inside(path: Path, roots: list[Path]) -> bool:
    return any(path.is_relative_to(root) for root in roots)


def resolve_inside(key: str, value: str, roots: list[Path] | tuple[Path, ...]) -> Path:
    """The local path ``value`` of run-spec key ``key``, resolved (symlinks followed, '..' removed); a
    SpecError naming the key when it lies outside every root (checked first, so nothing is said about
    files elsewhere) or does not exist."""
    roots = [Path(root).expanduser().resolve() for root in roots]
    path = Path(value).expanduser().resolve()
    if not _inside(path, roots):
        raise SpecError(
            key,
            f"{value!r} is outside the directories runs may read (GRPO_PATH_ROOTS: the operator sets them; "
            "the models folder <data dir>/models, where the Launch tab uploads models, and uploaded datasets are "
            "always readable)",
        )
    if not path.exists():
        raise SpecError(key, f"{value!r} does not exist")
    return path


def _check_links_inside(key: str, value: str, directory: Path, roots) -> None:
    """Refuse a dataset or model directory holding a file or folder that links outside every root: a run reads
    every file in it, so a link would let it read anything."""
    roots = [Path(root).expanduser().resolve() for root in roots]
    for entry in directory.rglob("*"):
        if entry.is_symlink() and not _inside(entry.resolve(), roots):
            raise SpecError(
                key,
                f"{value!r} holds {str(entry.relative_to(directory))!r}, a link to a file outside "
                "the directories runs may read",
            )


def check_spec_paths(config: dict, roots: list[Path] | tuple[Path, ...]) -> None:
    """Refuse a run spec whose local paths lie outside every root or cannot be used.

    For each of ``model``, ``reward_model``, ``label_completer``, ``dataset`` and ``rm_data`` that is a local path (:func:`is_local_path`):
    it resolves inside a root (checked first, so nothing is said about files elsewhere), exists, and is
    a directory with ``config.json`` or a .gguf file (the models: :func:`check_gguf_file`) or a dataset file that
    reads cleanly (the dataset). Raises SpecError naming the key.
    """
    for key in PATH_KEYS:
        value = config.get(key) or ""
        if not is_local_path(value):
            continue
        path = resolve_inside(key, value, roots)
        if path.is_dir():
            _check_links_inside(key, value, path, roots)
        if key == "rm_data":
            if not path.is_file() or path.suffix.lower() not in (".jsonl", ".parquet"):
                raise SpecError(key, f"{value!r} is not a .jsonl or .parquet file of Math-Shepherd rows")
        elif key == "dataset" and path.is_dir():
            if not any(f.suffix.lower() in DATA_DIR_SUFFIXES for f in path.rglob("*") if f.is_file()):
                raise SpecError(
                    key,
                    f"{value!r} is not a dataset file, nor a dataset directory (one that holds "
                    f"{', '.join(DATA_DIR_SUFFIXES)} files)",
                )
        elif key == "dataset":
            if not path.is_file():
                raise SpecError(key, f"{value!r} is not a dataset file (a dataset file is .jsonl, .csv or .parquet)")
            try:
                check_dataset_file(path, name=value, fields=spec_fields(config))
            except ValueError as e:
                raise SpecError(key, str(e)) from None
        elif is_gguf(value):
            check_gguf_file(key, value, path)
        elif not (path / "config.json").is_file():
            raise SpecError(key, f"{value!r} is not a model directory: it has no config.json")


def check_gguf_file(key: str, value: str, path: Path) -> None:
    """Refuse, naming ``key``, a .gguf model that is not a file starting with the GGUF magic, or that this machine
    cannot convert (the gguf package missing: validate_spec says so for ``model``, this for the other model
    keys)."""
    if not path.is_file():
        raise SpecError(key, f"{value!r} is not a .gguf file but a directory")
    try:
        ok = is_gguf_file(path)
    except OSError as e:
        raise SpecError(key, f"{value!r} cannot be read: {e.strerror or e}") from None
    if not ok:
        raise SpecError(key, f"{value!r} is not a GGUF file (it does not start with 'GGUF')")
    if importlib.util.find_spec("gguf") is None:
        raise SpecError(
            key, f"{value!r} is a .gguf file, which needs the gguf package to read: pip install 'gguf>=0.10'"
        )


def check_custom_rewards(config: dict, roots: list[Path] | tuple[Path, ...], allowed: bool) -> None:
    """Refuse a run spec's custom reward functions (``rewards``), SpecError naming ``rewards``: any of them when
    ``allowed`` is False (GRPO_ALLOW_CUSTOM_REWARDS is not set), an entry point no installed package declares, and
    a file (``/path/file.py:function``) outside every root, missing, or not a .py file."""
    rewards = config.get("rewards") or ()
    try:
        check_custom_allowed(rewards, allowed)
    except ValueError as e:
        raise SpecError("rewards", str(e)) from None
    for r in rewards:
        where = file_reference(r["name"])
        if where is not None and not resolve_inside("rewards", where[0], roots).is_file():
            raise SpecError("rewards", f"{where[0]!r} is not a file")
