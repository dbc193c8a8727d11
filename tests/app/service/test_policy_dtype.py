"""The trained policy downloads in the dtype the model came in (app.service.exports), or in fp32 as it trained.

Fast: fp32 rounded to bf16 by numpy (ties to even, inf, NaN) against hand numbers and torch's rounding; a model's
source dtype (model.source_dtype: config.json's dtype, a .gguf file's float type from its header); a final policy
converted to bf16 and fp16 (one file, or sharded with an index) that transformers loads in that dtype, and one
without its source dtype read as fp32. Real runs: a bf16 copy of the built-in model trained by the worker's code
against a real store (SQLite and PostgreSQL) and downloaded through a live server, whose download in its source
dtype loads in bf16, holds the fp32 download's weights rounded to nearest even and takes about half its bytes, the
server never loading torch; a LoRA run's merged policy in bf16 and its adapter in fp32.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from gradio_client import Client
from gradio_client.exceptions import AppError
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from app import store
from app.service import api, exports
from app.service.exports import bf16_bits
from app.store.db import session_scope
from grpo_engine.model.model import builtin_model_dir, source_dtype
from grpo_engine.spec.config import validate_spec
from tests.support.servers import running_server, server_env
from workers.runner import execute_run

QUEUE = "grpo-dtype-test"
TINY = {"steps_per_iteration": 2, "batch_size": 2, "group_size": 4, "eval_every": 0, "learning_rate": 1e-3}
TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


# ---- fp32 -> bf16 and fp16 without torch --------------------------------------------------------


@pytest.mark.parametrize(
    "fp32, bf16",
    [
        (0x3F800000, 0x3F80),  # 1.0, exact
        (0x3F808000, 0x3F80),  # 1 + 2^-8: halfway between 1.0 and 1.0078125, ties to the even 1.0
        (0x3F818000, 0x3F82),  # halfway between 0x3F81 (odd) and 0x3F82 (even): up
        (0x3F807FFF, 0x3F80),  # just below halfway: down
        (0x3F808001, 0x3F81),  # just above halfway: up
        (0xBF808001, 0xBF81),  # the same below zero: away from zero in magnitude
        (0x80000000, 0x8000),  # -0.0 stays negative
        (0x00000001, 0x0000),  # the smallest fp32 subnormal rounds to zero
        (0x7F7F7FFF, 0x7F7F),  # bf16's largest, from below
        (0x7F7F8000, 0x7F80),  # halfway past bf16's largest (odd mantissa): up to inf
        (0x7F7FFFFF, 0x7F80),  # fp32's largest: inf
        (0x7F800000, 0x7F80),  # inf
        (0xFF800000, 0xFF80),  # -inf
        (0x7FC00000, 0x7FC0),  # quiet NaN
        (0x7F800001, 0x7FC0),  # a signalling NaN is not truncated into inf
        (0xFFFFFFFF, 0x7FC0),  # a NaN whose rounding add would wrap around
    ],
)
def test_fp32_rounds_to_bf16_to_nearest_even(fp32, bf16):
    assert int(bf16_bits(np.array([fp32], np.uint32))[0]) == bf16


def test_bf16_and_fp16_conversions_match_torch_on_random_bit_patterns():
    """Every finite value and infinity rounds exactly as torch rounds; a NaN stays a NaN."""
    words = np.random.default_rng(0).integers(0, 2**32, 1_000_000, dtype=np.uint64).astype(np.uint32)
    values = torch.from_numpy(words.view(np.float32).copy())
    nan = values.isnan().numpy()
    assert 0 < nan.sum() < len(words)  # some NaNs among them
    for dtype in ("bfloat16", "float16"):
        ours = torch.from_numpy(np.frombuffer(exports._converted(words, dtype), "<u2").view(np.int16).copy())
        theirs = values.to(TORCH_DTYPES[dtype])
        assert torch.equal(ours[~nan], theirs.view(torch.int16)[~nan]), dtype
        assert ours.view(TORCH_DTYPES[dtype])[nan].isnan().all(), dtype


# ---- the dtype a model came in -----------------------------------------------------------------


def write_gguf(path: Path, kind: str) -> Path:
    """A small GGUF file: an fp32 norm and a 64x64 weight of ``kind`` (F32, F16, BF16, Q8_0, Q4_1)."""
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize

    writer = GGUFWriter(str(path), "llama")
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(64, np.float32))
    weight = np.random.default_rng(0).random((64, 64), np.float32)
    if kind == "F32":
        writer.add_tensor("blk.0.attn_q.weight", weight)
    elif kind == "F16":
        writer.add_tensor("blk.0.attn_q.weight", weight.astype(np.float16))
    else:
        packed = quantize(weight, GGMLQuantizationType[kind])
        writer.add_tensor("blk.0.attn_q.weight", packed, raw_shape=packed.shape, raw_dtype=GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(
    "kind, dtype",
    [("F32", "float32"), ("F16", "float16"), ("BF16", "bfloat16"), ("Q8_0", "bfloat16"), ("Q4_1", "bfloat16")],
)
def test_a_gguf_files_source_dtype_is_its_float_type_and_bf16_for_a_quantized_one(tmp_path, kind, dtype):
    assert source_dtype(str(write_gguf(tmp_path / f"m-{kind}.gguf", kind)), tmp_path / "cache") == dtype


def test_a_model_directorys_source_dtype_is_what_its_config_declares(grpo_cache_dir, tmp_path):
    builtin = builtin_model_dir(grpo_cache_dir)
    assert source_dtype("builtin-arith", grpo_cache_dir) == "float32"
    config = json.loads((builtin / "config.json").read_text())
    for name, declared, expected in [
        ("bf16", {"dtype": "bfloat16"}, "bfloat16"),
        ("fp16-old-key", {"torch_dtype": "float16"}, "float16"),
        ("none", {}, "float32"),
        ("fp64", {"dtype": "float64"}, "float32"),
    ]:
        folder = tmp_path / name
        folder.mkdir()
        body = {k: v for k, v in config.items() if k not in ("dtype", "torch_dtype")}
        (folder / "config.json").write_text(json.dumps({**body, **declared}))
        assert source_dtype(str(folder), grpo_cache_dir) == expected, name


# ---- a final policy converted at download ------------------------------------------------------


def settings_env(db_url: str, tmp_path: Path, monkeypatch, cache_dir: Path) -> dict[str, str]:
    """A server's environment, whose settings this process takes too: the store at ``db_url``, a broker file, the
    model cache, a checkpoint directory and path roots in tmp_path."""
    env = server_env(
        tmp_path / "data",
        GRPO_DATABASE_URL=db_url,
        GRPO_QUEUE=QUEUE,
        GRPO_CACHE_DIR=str(cache_dir),
        GRPO_CHECKPOINT_DIR=str(tmp_path / "checkpoints"),
        GRPO_PATH_ROOTS=str(tmp_path),
    )
    for key in [k for k in os.environ if k.startswith("GRPO_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        if key.startswith("GRPO_"):
            monkeypatch.setenv(key, value)
    (tmp_path / "data").mkdir(exist_ok=True)
    return env


@pytest.fixture
def store_env(sqlite_url, tmp_path, monkeypatch, grpo_cache_dir) -> dict[str, str]:
    return settings_env(sqlite_url, tmp_path, monkeypatch, grpo_cache_dir)


def unzip(path: str | Path, into: Path) -> Path:
    """The one folder a download's zip holds, extracted into ``into``."""
    with zipfile.ZipFile(path) as archive:
        archive.extractall(into)
    (folder,) = into.iterdir()
    return folder


def rounded_as_torch_rounds(converted: Path, trained: Path, dtype: torch.dtype) -> None:
    """Every tensor of the model directory ``converted`` is ``trained``'s fp32 tensor rounded to ``dtype``, bit
    for bit, and transformers loads ``converted`` in ``dtype``."""
    ours, theirs = {}, {}
    for file in converted.glob("*.safetensors"):
        ours.update(load_file(file))
    for file in trained.glob("*.safetensors"):
        theirs.update(load_file(file))
    assert ours.keys() == theirs.keys() and ours
    for name, weight in theirs.items():
        assert weight.dtype == torch.float32 and ours[name].dtype == dtype, name
        assert torch.equal(ours[name].view(torch.int16), weight.to(dtype).view(torch.int16)), name
    model = AutoModelForCausalLM.from_pretrained(converted)
    assert {p.dtype for p in model.parameters()} == {dtype}
    ids = AutoTokenizer.from_pretrained(converted)("2+3*4=", return_tensors="pt").input_ids
    assert model(ids).logits.dtype == dtype


@pytest.mark.parametrize(
    "declared, sharded",
    [("bfloat16", False), ("float16", False), ("bfloat16", True), (None, False)],
    ids=["bf16", "fp16", "bf16-sharded", "undeclared"],
)
def test_a_final_policy_downloads_in_its_source_dtype(store_env, grpo_cache_dir, tmp_path, declared, sharded):
    with session_scope() as s:
        run_id = store.create_run(s, validate_spec({}).to_dict(), "t")
        store.finish_run(s, run_id, "completed")
    final = tmp_path / "checkpoints" / f"run-{run_id}" / "final"
    model = AutoModelForCausalLM.from_pretrained(builtin_model_dir(grpo_cache_dir), dtype=torch.float32)
    model.save_pretrained(final / "model", max_shard_size="1MB" if sharded else "50GB")
    AutoTokenizer.from_pretrained(builtin_model_dir(grpo_cache_dir)).save_pretrained(final / "model")
    if declared:
        (final / "policy.json").write_text(json.dumps({"source_dtype": declared}))
    assert (final / "model" / "model.safetensors.index.json").is_file() == sharded

    source = Path(exports.export_run(run_id, "model"))
    short = {"bfloat16": "bf16", "float16": "fp16", None: "fp32"}[declared]
    assert source.name == f"run-{run_id}-model-{short}.zip"
    folder = unzip(source, tmp_path / "source")
    assert folder.name == f"run-{run_id}-model-{short}"
    dtype = TORCH_DTYPES[declared or "float32"]
    rounded_as_torch_rounds(folder, final / "model", dtype)
    config = json.loads((folder / "config.json").read_text())
    assert config["dtype"] == str(dtype).removeprefix("torch.")
    if sharded:
        index = json.loads((folder / "model.safetensors.index.json").read_text())
        shards = set(index["weight_map"].values())
        sizes = [t.nbytes for shard in shards for t in load_file(folder / shard).values()]
        assert len(shards) > 1 and index["metadata"]["total_size"] == sum(sizes)
    fp32 = Path(exports.export_run(run_id, "model", "fp32"))
    assert fp32.name == f"run-{run_id}-model-fp32.zip"
    rounded_as_torch_rounds(unzip(fp32, tmp_path / "fp32"), final / "model", torch.float32)
    with pytest.raises(api.ApiError, match=r"^dtype must be one of source, fp32, got 'bf16'$"):
        exports.export_run(run_id, "model", "bf16")


# ---- real runs ---------------------------------------------------------------------------------


@pytest.fixture
def bf16_model(grpo_cache_dir, tmp_path) -> Path:
    """The built-in model as a checkpoint that came in bf16, as most hub models do."""
    out = tmp_path / "bf16-model"
    builtin = builtin_model_dir(grpo_cache_dir)
    AutoModelForCausalLM.from_pretrained(builtin, dtype=torch.bfloat16).save_pretrained(out)
    AutoTokenizer.from_pretrained(builtin).save_pretrained(out)
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    return out


@pytest.fixture
def run_env(db_url, tmp_path, monkeypatch, grpo_cache_dir) -> dict[str, str]:
    return settings_env(db_url, tmp_path, monkeypatch, grpo_cache_dir)


def test_a_bf16_models_trained_policy_downloads_in_bf16_or_fp32_from_a_live_server(run_env, bf16_model, tmp_path):
    with running_server(tmp_path, run_env) as (url, proc, log):
        client = Client(url, verbose=False)
        run_id = client.predict({**TINY, "model": str(bf16_model)}, api_name="/launch_run")["run_id"]
        assert execute_run(run_id) == "completed", log.read_text()  # the worker's code, in this process
        source = Path(client.predict(run_id, "model", api_name="/export_run"))
        fp32 = Path(client.predict(run_id, "model", "fp32", api_name="/export_run"))
        with pytest.raises(AppError, match="dtype must be one of source, fp32, got 'fp16'"):
            client.predict(run_id, "model", "fp16", api_name="/export_run")
        assert "libtorch" not in Path(f"/proc/{proc.pid}/maps").read_text()  # converted without torch

    final = tmp_path / "checkpoints" / f"run-{run_id}" / "final"
    assert json.loads((final / "policy.json").read_text()) == {"source_dtype": "bfloat16"}
    assert (source.name, fp32.name) == (f"run-{run_id}-model-bf16.zip", f"run-{run_id}-model-fp32.zip")
    assert 0.45 < source.stat().st_size / fp32.stat().st_size < 0.6  # the weights take half the bytes
    source_dir, fp32_dir = unzip(source, tmp_path / "source"), unzip(fp32, tmp_path / "fp32")
    rounded_as_torch_rounds(source_dir, fp32_dir, torch.bfloat16)
    rounded_as_torch_rounds(fp32_dir, final / "model", torch.float32)  # fp32: the trained weights as they are
    start, trained = load_file(bf16_model / "model.safetensors"), load_file(fp32_dir / "model.safetensors")
    assert any(not torch.equal(start[name].float(), trained[name]) for name in start)  # the run trained


def test_a_lora_runs_merged_policy_downloads_in_bf16_and_its_adapter_in_fp32(store_env, bf16_model, tmp_path):
    run_id = api.launch_run({**TINY, "model": str(bf16_model), "lora_rank": 4})["run_id"]
    assert execute_run(run_id) == "completed"
    final = tmp_path / "checkpoints" / f"run-{run_id}" / "final"
    merged = unzip(exports.export_run(run_id, "model"), tmp_path / "merged")
    assert merged.name == f"run-{run_id}-model-bf16"
    rounded_as_torch_rounds(merged, final / "model", torch.bfloat16)
    for dtype in ("source", "fp32"):
        path = Path(exports.export_run(run_id, "adapter", dtype))
        assert path.name == f"run-{run_id}-adapter.zip"
        adapter = unzip(path, tmp_path / f"adapter-{dtype}")
        weights = adapter / "adapter_model.safetensors"
        assert weights.read_bytes() == (final / "adapter" / weights.name).read_bytes()  # fp32, as trained
