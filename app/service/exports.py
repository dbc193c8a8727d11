"""Exports of a run: its recorded samples and its evaluations' outputs (Parquet, CSV), its config (JSON) and its trained policy (a zip).

The trained policy downloads in the dtype the model came in (``dtype`` "source": bf16 for most hub checkpoints, a
.gguf file's float type, bf16 for a quantized one; the worker records it beside the policy, see
grpo_engine.train.checkpoint.save_final), or in fp32 as it trained (``dtype`` "fp32"). The worker saves it in fp32
only; the conversion happens here, without torch (this is the web process): the safetensors files are read and
written straight into the zip one slice of a tensor at a time, fp32 rounded to bf16 to nearest, ties to even
(:func:`bf16_bits`), or to fp16 by numpy, so the process never holds the model, let alone twice.

Each export is written to a fresh directory inside this process's own temporary directory (mode 0700, deleted at
exit), by a create that refuses an existing file or a link, so no other user or dashboard on the host can plant
or read a file in its way; exports are deleted an hour after they were written.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import struct
import tempfile
import time
import zipfile
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from app import store
from app.core.run_status import RunStatus
from app.core.settings import get_settings
from app.service.api import ApiError, as_id, require_run
from app.store.db import session_scope
from grpo_engine.report.run_files import FINAL_DIR, FINAL_INFO

EXPORT_KINDS = ("parquet", "csv", "eval-parquet", "eval-csv", "config", "model", "adapter")
TABLE_KINDS = {  # a table's kind -> (the store's rows, their columns, the file's name, its format)
    "parquet": (store.iter_sample_rows, store.EXPORT_COLUMNS, "groups", "parquet"),
    "csv": (store.iter_sample_rows, store.EXPORT_COLUMNS, "groups", "csv"),
    "eval-parquet": (store.iter_eval_rows, store.EVAL_EXPORT_COLUMNS, "evaluations", "parquet"),
    "eval-csv": (store.iter_eval_rows, store.EVAL_EXPORT_COLUMNS, "evaluations", "csv"),
}
LIST_COLUMNS = (  # the columns holding lists or dicts: Parquet keeps them, CSV writes them as JSON text
    "reward_components",
    "tokens",
    "advantages",
    "step_rewards",
    "step_end_indices",
    "step_labels",
    "step_shares",
)
POLICY_KINDS = ("model", "adapter")  # the trained policy: merged model, or the LoRA adapter alone
POLICY_DTYPES = ("source", "fp32")  # the trained model's download: the dtype the model came in, or fp32 as trained
SHORT_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}  # a download's name says its dtype
SAFETENSORS_DTYPES = {"bfloat16": "BF16", "float16": "F16"}  # the dtypes an fp32 tensor is converted to
SLICE = 1 << 20  # fp32 values converted at a time (4 MB read, 2 MB written)


def bf16_bits(words: np.ndarray) -> np.ndarray:
    """fp32 bit patterns (uint32) -> bfloat16 bit patterns (uint16), rounded to nearest, ties to even, as torch's
    ``.to(torch.bfloat16)`` rounds: the low 16 bits are dropped after adding 0x7FFF plus the kept part's last bit.
    A value past bf16's largest rounds to inf; every NaN becomes the quiet NaN 0x7FC0.

    >>> f32 = np.array([0x3F800000, 0x3F808000, 0x3F818000, 0x3F808001, 0xBF80FFFF], np.uint32)  # 1, ties, -1.0078
    >>> [hex(b) for b in bf16_bits(f32)]
    ['0x3f80', '0x3f80', '0x3f82', '0x3f81', '0xbf81']
    >>> [hex(b) for b in bf16_bits(np.array([0x7F7FFFFF, 0xFF800000, 0x7F800001, 0xFFC00000], np.uint32))]
    ['0x7f80', '0xff80', '0x7fc0', '0x7fc0']
    """
    words = words.astype(np.uint32, copy=False)
    rounded = (words + (0x7FFF + ((words >> 16) & 1))) >> 16  # wraps around only for NaNs, replaced below
    return np.where((words & 0x7FFFFFFF) > 0x7F800000, 0x7FC0, rounded).astype(np.uint16)


def _converted(words: np.ndarray, dtype: str) -> bytes:
    """The fp32 values whose little-endian bit patterns are ``words``, in ``dtype`` ("bfloat16", "float16"), as
    little-endian bytes; numpy's fp16 cast rounds to nearest, ties to even, and overflows to inf."""
    if dtype == "bfloat16":
        return bf16_bits(words).astype("<u2").tobytes()
    with np.errstate(over="ignore"):
        return words.view("<f4").astype("<f2").tobytes()


def _safetensors_header(path: Path) -> tuple[dict, int]:
    """A safetensors file's header (tensor name -> dtype, shape, data_offsets; ``__metadata__``) and where its
    data start: the file is an 8-byte little-endian header length, the JSON header, then the tensors' bytes."""
    with open(path, "rb") as fh:
        (length,) = struct.unpack("<Q", fh.read(8))
        return json.loads(fh.read(length)), 8 + length


def _converted_header(header: dict, dtype: str) -> tuple[dict, int]:
    """The header of the same tensors with the fp32 ones in ``dtype`` (two bytes a value), laid out in the same
    order, and the size of their data."""
    out, offset = {}, 0
    tensors = sorted((v["data_offsets"][0], k) for k, v in header.items() if k != "__metadata__")
    for _, name in tensors:
        info = header[name]
        begin, end = info["data_offsets"]
        convert = info["dtype"] == "F32"
        size = (end - begin) // 2 if convert else end - begin
        dtype_code = SAFETENSORS_DTYPES[dtype] if convert else info["dtype"]
        out[name] = {"dtype": dtype_code, "shape": info["shape"], "data_offsets": [offset, offset + size]}
        offset += size
    if "__metadata__" in header:
        out["__metadata__"] = header["__metadata__"]
    return out, offset


def _write_safetensors(archive: zipfile.ZipFile, file: Path, name: str, dtype: str) -> None:
    """The safetensors file ``file`` into ``archive`` as ``name`` with its fp32 tensors in ``dtype``, streamed: the
    tensors are read in order, SLICE values at a time, converted or copied as they are."""
    header, start = _safetensors_header(file)
    new_header, data_size = _converted_header(header, dtype)
    encoded = json.dumps(new_header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)  # the data start 8-byte aligned, as safetensors writes them
    info = zipfile.ZipInfo.from_file(file, name)
    info.compress_type, info.file_size = zipfile.ZIP_STORED, 8 + len(encoded) + data_size
    tensors = sorted((v["data_offsets"], v["dtype"]) for k, v in header.items() if k != "__metadata__")
    with open(file, "rb") as source, archive.open(info, "w") as entry:
        entry.write(struct.pack("<Q", len(encoded)) + encoded)
        for (begin, end), kind in tensors:
            source.seek(start + begin)
            for at in range(begin, end, SLICE * 4):
                piece = source.read(min(end, at + SLICE * 4) - at)
                entry.write(_converted(np.frombuffer(piece, "<u4"), dtype) if kind == "F32" else piece)


def _config_in(text: str, dtype: str) -> bytes:
    """A model's config.json declaring ``dtype`` (its "dtype" and "torch_dtype" keys; "dtype" where it has
    neither), so from_pretrained loads the weights in it."""
    config = json.loads(text)
    keys = [k for k in ("dtype", "torch_dtype") if k in config] or ["dtype"]
    config.update(dict.fromkeys(keys, dtype))
    return (json.dumps(config, indent=2, sort_keys=True) + "\n").encode("utf-8")


def _index_in(file: Path, dtype: str) -> bytes:
    """A sharded model's model.safetensors.index.json with its total size in ``dtype``."""
    index = json.loads(file.read_text())
    shards = sorted(set(index["weight_map"].values()))
    total = sum(_converted_header(_safetensors_header(file.parent / s)[0], dtype)[1] for s in shards)
    index.setdefault("metadata", {})["total_size"] = total
    return (json.dumps(index, indent=2, sort_keys=True) + "\n").encode("utf-8")


def _add_file(archive: zipfile.ZipFile, file: Path, name: str, dtype: str) -> None:
    """One file of a model directory into ``archive`` as ``name``, in ``dtype``: the weights converted, the config
    and the shards' index saying so; every other file (tokenizer, generation config) as it is."""
    if dtype == "float32":
        archive.write(file, name)
    elif file.suffix == ".safetensors":
        _write_safetensors(archive, file, name, dtype)
    elif file.name == "config.json":
        archive.writestr(zipfile.ZipInfo.from_file(file, name), _config_in(file.read_text(), dtype))
    elif file.name.endswith(".safetensors.index.json"):
        archive.writestr(zipfile.ZipInfo.from_file(file, name), _index_in(file, dtype))
    else:
        archive.write(file, name)


def source_dtype(final: Path) -> str:
    """The dtype the model of the final policy in ``final`` came in, from its policy.json; "float32" where it has
    none or names a dtype the download does not convert to."""
    try:
        dtype = json.loads((final / FINAL_INFO).read_text()).get("source_dtype")
    except (OSError, ValueError, AttributeError):
        return "float32"
    return dtype if dtype in SHORT_DTYPES else "float32"


def _export_policy(run: dict, kind: str, dtype: str, out_dir: Path) -> str:
    """Zip the run's final policy directory (``<GRPO_CHECKPOINT_DIR>/run-<id>/final/<kind>``, written by
    the worker when the run completed) and return the zip's path: the model in the dtype its model came in
    (``dtype`` "source") or in fp32 ("fp32"), the adapter in fp32 always (peft keeps adapter weights in fp32 on a
    bf16 base)."""
    run_id = run["run_id"]
    if kind == "adapter" and not run["config"].get("lora_rank"):
        raise ApiError(f"run {run_id} trained every weight (lora_rank 0): it has no adapter; export 'model'")
    if run["config"].get("steps_per_iteration") == 0:
        raise ApiError(f"run {run_id} only evaluated its model (steps_per_iteration 0): it trained no policy")
    final = get_settings().run_dir(run_id) / FINAL_DIR
    source = final / kind
    if not source.is_dir():
        if run["status"] != RunStatus.COMPLETED:
            raise ApiError(
                f"run {run_id} has no final policy: it is saved when the run completes (status {run['status']})"
            )
        raise ApiError(
            f"run {run_id}: its final policy is not in this dashboard's checkpoint directory "
            "(GRPO_CHECKPOINT_DIR must be a directory the workers and the dashboard share)"
        )
    target = source_dtype(final) if kind == "model" and dtype == "source" else "float32"
    name = f"run-{run_id}-model-{SHORT_DTYPES[target]}" if kind == "model" else f"run-{run_id}-{kind}"
    path = out_dir / f"{name}.zip"
    with _create(path) as out, zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as archive:
        for file in sorted(source.rglob("*")):  # safetensors hardly compress
            if file.is_file():
                _add_file(archive, file, str(Path(name) / file.relative_to(source)), target)
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


def export_run(run_id: Any, kind: Any = "parquet", dtype: Any = "source") -> str:
    """Write a run's export to a file and return its path: every recorded sample as Parquet or CSV
    (one row per sample; tokens, advantages and step data as lists in Parquet, JSON text in CSV), every output of
    every held-out evaluation ("eval-parquet", "eval-csv": one row per greedy or sampled output, with the answer
    the verifier read, its rule and verdicts), the run's config as JSON (``kind`` "config") that /launch_run takes
    back as it is, or the trained policy of a completed run as a zip of a Hugging Face model directory
    (safetensors): "model" (LoRA merged into the base) in the dtype the model came in (``dtype`` "source", the
    default) or in fp32 as it trained (``dtype`` "fp32"), or "adapter" (the LoRA adapter alone, for peft, in
    fp32). ``dtype`` is read for "model" only."""
    run_id = as_id(run_id)
    kind, dtype = kind or "parquet", dtype or "source"
    if kind not in EXPORT_KINDS:
        raise ApiError(f"kind must be one of {', '.join(EXPORT_KINDS)}, got {kind!r}")
    if dtype not in POLICY_DTYPES:
        raise ApiError(f"dtype must be one of {', '.join(POLICY_DTYPES)}, got {dtype!r}")
    out_dir = _export_dir()
    with session_scope() as s:
        run = require_run(s, run_id)
        if kind == "config":
            path = out_dir / f"run-{run_id}-config.json"
            with _create(path) as out:
                out.write((json.dumps(run["config"], indent=2, sort_keys=True) + "\n").encode("utf-8"))
            return str(path)
        if kind in POLICY_KINDS:
            return _export_policy(run, kind, dtype, out_dir)
        rows_of, columns, table, file_format = TABLE_KINDS[kind]
        frame = pd.DataFrame(list(rows_of(s, run_id)), columns=list(columns))
    path = out_dir / f"run-{run_id}-{table}.{file_format}"
    if file_format == "csv":
        for column in set(LIST_COLUMNS) & set(columns):
            frame[column] = [None if v is None else json.dumps(v) for v in frame[column]]
    with _create(path) as out:
        if file_format == "parquet":
            frame.to_parquet(out, index=False)
        else:
            out.write(frame.to_csv(index=False).encode("utf-8"))
    return str(path)
