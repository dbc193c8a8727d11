"""A run's memory estimate (grpo_engine.spec.memory), the workers table, and launch refusing what fits no GPU.

Estimates and messages on hand-computed numbers; the safetensors-header counts against the loaded torch
model and peft's own LoRA count; the workers table and its store functions on SQLite and PostgreSQL;
app.service.api.launch_run over a real SQLite store and broker with workers reported in the store; and a real
``grpo-dashboard worker`` process reporting itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import inspect, update

from app import store
from app.service import api
from app.store.db import alembic_config, make_engine, session_scope, upgrade_database
from app.store.models import Worker
from grpo_engine.spec.memory import (
    MemoryEstimate,
    count_parameters,
    estimate_memory,
    gigabytes,
    lora_trainable_params,
    too_big_message,
)
from tests.support.servers import ROOT, stop_process
from tests.support.tiny_models import write_tiny_model

QUEUE = "grpo-test"
QWEN_05B = 494_032_768  # Qwen2.5-0.5B's parameters


# ---- the estimate -------------------------------------------------------------------------------


def test_full_fine_tune_in_bf16():
    e = estimate_memory(QWEN_05B, QWEN_05B, lora=False, bf16=True)
    assert e == MemoryEstimate(
        policy=1_976_131_072, gradients=1_976_131_072, optimizer=3_952_262_144, reference=988_065_536, reward_model=0
    )
    assert e.total == 18 * QWEN_05B == 8_892_589_824
    assert (
        e.describe() == "policy 1.98 GB, gradients 1.98 GB, optimizer state 3.95 GB, reference 0.99 GB, total 8.89 GB"
    )


def test_8bit_moments_take_a_quarter_of_the_optimizer_state():
    """optimizer adamw_8bit: 2 bytes a trainable parameter for AdamW's two moments instead of 8 (the module
    docstring's Qwen2.5-0.5B: 0.99 GB instead of 3.95 GB, 5.93 GB in all); nothing else changes."""
    e = estimate_memory(QWEN_05B, QWEN_05B, lora=False, bf16=True, optimizer="adamw_8bit")
    assert e.optimizer == 2 * QWEN_05B == 988_065_536
    assert e.total == 12 * QWEN_05B and e.describe().endswith(
        "optimizer state 0.99 GB, reference 0.99 GB, total 5.93 GB"
    )
    full = estimate_memory(QWEN_05B, QWEN_05B, lora=False, bf16=True)
    assert (e.policy, e.gradients, e.reference) == (full.policy, full.gradients, full.reference)


def test_sharding_splits_the_trained_state_and_gathers_the_policy_once_for_sampling():
    """sharding 'fsdp' across n processes: policy, gradients, optimizer state and reference / n on each, plus the
    whole policy in the sampling dtype (bf16 here) while sampling. Qwen2.5-0.5B, full fine-tune on 4 GPUs: 18 / 4 + 2
    = 6.5 bytes a parameter, 3.21 GB (the module docstring's example)."""
    full = estimate_memory(QWEN_05B, QWEN_05B, lora=False, bf16=True)
    four = estimate_memory(QWEN_05B, QWEN_05B, lora=False, bf16=True, shards=4)
    assert (four.policy, four.gradients, four.optimizer, four.reference) == (
        full.policy // 4,
        full.gradients // 4,
        full.optimizer // 4,
        full.reference // 4,
    )
    assert four.gathered == 2 * QWEN_05B and full.gathered == 0
    assert four.total == 6.5 * QWEN_05B and four.describe().endswith("gathered for sampling 0.99 GB, total 3.21 GB")
    assert estimate_memory(QWEN_05B, QWEN_05B, lora=False, bf16=False, shards=2).gathered == 4 * QWEN_05B
    lora = estimate_memory(1040, 40, lora=True, bf16=True, shards=2)  # the base is sharded too
    assert (lora.policy, lora.gradients, lora.reference, lora.gathered) == (2080, 80, 0, 2080)


def test_fp32_reference_lora_and_reward_model():
    assert estimate_memory(1000, 1000, lora=False, bf16=False).reference == 4000  # fp32 reference: 4 bytes each
    lora = estimate_memory(1040, 40, lora=True, bf16=True)  # 1000 base + 40 adapter parameters
    assert lora == MemoryEstimate(policy=4160, gradients=160, optimizer=320, reference=0, reward_model=0)
    assert lora.describe() == "policy 0.0 MB, gradients 0.0 MB, optimizer state 0.0 MB, total 0.0 MB"
    assert estimate_memory(579_840, 579_840, lora=False, bf16=False).describe() == (  # the built-in model
        "policy 2.3 MB, gradients 2.3 MB, optimizer state 4.6 MB, reference 2.3 MB, total 11.6 MB"
    )
    # the RM: 4 (weights) + 4 (gradients) + 8 (AdamW) per parameter, plus its frozen prior: 4 fp32, 2 bf16
    assert estimate_memory(100, 100, lora=False, bf16=False, rm_params=50).reward_model == 20 * 50
    with_rm = estimate_memory(100, 100, lora=False, bf16=True, rm_params=500_000_000)
    assert with_rm.reward_model == 18 * 500_000_000 and with_rm.total == 1600 + 200 + 9_000_000_000
    assert with_rm.describe().endswith("reference 0.00 GB, reward model 9.00 GB, total 9.00 GB")  # one scale


def test_too_big_message_names_the_keys_that_help():
    full = estimate_memory(QWEN_05B, QWEN_05B, lora=False, bf16=False)  # 20 bytes per parameter
    message = too_big_message(full, 8_000_000_000, "the largest GPU (NVIDIA L4)")
    assert message == (
        "the run needs about 9.88 GB for its weights, gradients, optimizer state and reference (policy 1.98 GB, "
        "gradients 1.98 GB, optimizer state 3.95 GB, reference 1.98 GB, total 9.88 GB) but the largest GPU "
        "(NVIDIA L4) has 8.00 GB; change lora_rank (> 0 trains an adapter: no full gradients or optimizer state, "
        "no separate reference), precision ('bf16' keeps the frozen reference and reward-model prior in bf16), "
        "optimizer ('adamw_8bit' keeps AdamW's moments in 8 bits: a quarter of their memory) or model (a smaller model)"
    )
    # 8-bit moments already: the optimizer is not named again
    eight_bit = estimate_memory(QWEN_05B, QWEN_05B, lora=False, bf16=False, optimizer="adamw_8bit")
    assert "optimizer (" not in too_big_message(eight_bit, 10**9, "x")
    # already LoRA and bf16: only the model is left to change
    lora = estimate_memory(2_000_000_000, 10_000_000, lora=True, bf16=True)
    message = too_big_message(lora, 4_000_000_000, "x", lora=True, bf16=True)
    assert message.endswith("but x has 4.00 GB; change model (a smaller model)")
    assert "for its weights, gradients and optimizer state (" in message
    # a learned reward model: named, and held in the list
    rm = estimate_memory(1000, 1000, lora=False, bf16=True, rm_params=10**9)
    message = too_big_message(rm, 10**9, "x", bf16=True)
    assert "optimizer state, reference and reward model (" in message
    assert "lora_rank" in message and "precision" not in message
    assert message.endswith("model (a smaller model) or reward_model (a smaller reward model)")


def test_lora_trainable_params_by_hand():
    assert lora_trainable_params([(128, 64), (64, 128)], 4) == (64 + 128) * 4 * 2 == 1536
    assert lora_trainable_params([], 8) == 0
    # Qwen2.5-0.5B at rank 8: 24 layers of q, k, v, o (hidden 896, 2 KV heads of 64) and gate, up, down (4864)
    layer = [(896, 896), (128, 896), (128, 896), (896, 896), (4864, 896), (4864, 896), (896, 4864)]
    assert lora_trainable_params(layer * 24, 8) == 4_399_104


# ---- counts from safetensors headers --------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    """A Llama (untied head) and a Qwen2 (tied head) tiny model, saved once for this module."""
    root = tmp_path_factory.mktemp("models")
    return {arch: write_tiny_model(root / arch, arch) for arch in ("llama", "qwen2")}


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_counts_match_the_loaded_model_and_peft(tiny_models, arch):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    params, linear = count_parameters(tiny_models[arch])
    model = AutoModelForCausalLM.from_pretrained(tiny_models[arch])
    assert params == sum(p.numel() for p in model.parameters())
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM"))
    trainable, everything = peft_model.get_nb_trainable_parameters()
    assert lora_trainable_params(linear, 4) == trainable
    assert everything == params + trainable
    assert len(linear) == 2 * 7  # 2 layers of q, k, v, o, gate, up, down; no embedding, no output head


def test_a_cpu_worker_refuses_a_run_over_its_memory_cap(tiny_models, monkeypatch):
    """A worker's GRPO_WORKER_MEMORY_GB (RLIMIT_DATA, read by memory_limit) below a run's estimate: the run is
    refused before training, naming the keys that shrink it; under no cap (or a large one) it goes on."""
    import torch
    from transformers import AutoModelForCausalLM

    from grpo_engine.spec.config import validate_spec
    from grpo_engine.train import loading

    policy = AutoModelForCausalLM.from_pretrained(tiny_models["llama"])
    spec = validate_spec({"model": str(tiny_models["llama"])})
    monkeypatch.setattr(loading, "memory_limit", lambda: 100_000)
    with pytest.raises(ValueError, match=r"but this worker's memory limit has 0\.1 MB; change lora_rank"):
        loading.check_memory(policy, spec, False, torch.device("cpu"), log=lambda m: None)
    monkeypatch.setattr(loading, "memory_limit", lambda: 2**30)
    loading.check_memory(policy, spec, False, torch.device("cpu"), log=lambda m: None)


def test_counts_of_a_sharded_model(tiny_models, tmp_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_models["llama"])
    model.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="200KB")
    assert not (tmp_path / "model.safetensors").exists()
    assert len(set(json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"].values())) > 1
    params, linear = count_parameters(tmp_path)
    assert params == count_parameters(tiny_models["llama"])[0]
    assert sorted(linear) == sorted(count_parameters(tiny_models["llama"])[1])


def test_counts_need_safetensors(tmp_path):
    assert count_parameters(tmp_path) is None  # no weights at all
    (tmp_path / "pytorch_model.bin").write_bytes(b"pickle")
    assert count_parameters(tmp_path) is None  # not safetensors: not read
    (tmp_path / "model.safetensors").write_bytes((7).to_bytes(8, "little") + b"not json")
    with pytest.raises(ValueError, match="not a safetensors file"):
        count_parameters(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": "../elsewhere.safetensors"}})
    )
    with pytest.raises(ValueError, match="outside the model directory"):
        count_parameters(tmp_path)


def test_counts_read_a_hand_written_header(tmp_path):
    header = {
        "__metadata__": {"format": "pt"},
        "model.embed_tokens.weight": {"dtype": "BF16", "shape": [100, 8], "data_offsets": [0, 1600]},
        "model.layers.0.mlp.up_proj.weight": {"dtype": "BF16", "shape": [16, 8], "data_offsets": [1600, 1856]},
        "model.layers.0.input_layernorm.weight": {"dtype": "BF16", "shape": [8], "data_offsets": [1856, 1872]},
        "lm_head.weight": {"dtype": "BF16", "shape": [100, 8], "data_offsets": [1872, 3472]},
    }
    text = json.dumps(header).encode()
    (tmp_path / "model.safetensors").write_bytes(len(text).to_bytes(8, "little") + text + bytes(3472))
    assert count_parameters(str(tmp_path)) == (800 + 128 + 8 + 800, [(16, 8)])


# ---- the workers table and its store functions -------------------------------------


def test_workers_table_comes_and_goes_with_migration_0003(db_url):
    engine = make_engine(db_url)
    command.downgrade(alembic_config(db_url), "0002")
    engine.dispose()
    assert "workers" not in inspect(engine).get_table_names()
    upgrade_database(db_url)
    engine.dispose()
    columns = {c["name"]: c for c in inspect(engine).get_columns("workers")}
    assert set(columns) == {"name", "queues", "gpus", "seen_at"}
    assert inspect(engine).get_pk_constraint("workers")["constrained_columns"] == ["name"]
    engine.dispose()


def test_report_worker_upserts_and_live_workers_ages_out(db_url):
    a100 = {"name": "NVIDIA A100-SXM4-80GB", "memory": 85_899_345_920}
    with session_scope(db_url) as s:
        store.report_worker(s, "gpu-host:11", ["grpo", "grpo.gpu"], [a100])
        store.report_worker(s, "cpu-host:22", ["grpo", "grpo.cpu"], [])
    with session_scope(db_url) as s:
        (_, first) = store.live_workers(s, 60)  # by name: cpu-host, gpu-host
    time.sleep(0.01)
    with session_scope(db_url) as s:  # the same worker again: its row is updated, not duplicated
        store.report_worker(s, "gpu-host:11", ["grpo", "grpo.gpu"], [a100, {**a100, "memory": 1}])
    with session_scope(db_url) as s:
        cpu, gpu = store.live_workers(s, 60)
    assert cpu == {"name": "cpu-host:22", "queues": ["grpo", "grpo.cpu"], "gpus": [], "seen_at": cpu["seen_at"]}
    assert gpu["name"] == "gpu-host:11" and gpu["queues"] == ["grpo", "grpo.gpu"]
    assert gpu["gpus"] == [a100, {**a100, "memory": 1}]
    assert datetime.fromisoformat(gpu["seen_at"]) > datetime.fromisoformat(first["seen_at"])
    with session_scope(db_url) as s:  # a worker not seen for a while is gone
        s.execute(
            update(Worker)
            .where(Worker.name == "cpu-host:22")
            .values(seen_at=datetime.now(timezone.utc) - timedelta(seconds=121))
        )
    with session_scope(db_url) as s:
        assert [w["name"] for w in store.live_workers(s, 120)] == ["gpu-host:11"]
        assert len(store.live_workers(s, 3600)) == 2


# ---- launch refuses what fits no GPU ----------------------------------------------------------------


@pytest.fixture
def launch_env(sqlite_url, tmp_path, tiny_models, monkeypatch):
    """Settings pointed at a fresh store and broker, with the tiny models' directory allowed in run specs."""
    monkeypatch.setenv("GRPO_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("GRPO_BROKER_URL", f"sqla+sqlite:///{tmp_path / 'broker.sqlite'}")
    monkeypatch.setenv("GRPO_QUEUE", QUEUE)
    monkeypatch.setenv("GRPO_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("GRPO_PATH_ROOTS", str(tiny_models["llama"].parent))
    monkeypatch.delenv("GRPO_LEASE_SECONDS", raising=False)
    monkeypatch.setenv(
        "GRPO_HUB_CHECK_SECONDS", "0"
    )  # a hub id is launched here; tests/engine/spec/test_hub.py checks the Hub
    return sqlite_url


def _report(url: str, name: str, queues: list[str], memory: list[int], age: float = 0) -> None:
    with session_scope(url) as s:
        store.report_worker(s, name, queues, [{"name": f"GPU {m}", "memory": m} for m in memory])
        if age:
            s.execute(
                update(Worker)
                .where(Worker.name == name)
                .values(seen_at=datetime.now(timezone.utc) - timedelta(seconds=age))
            )


def _need(model: Path, **kwargs) -> int:
    params, _ = count_parameters(model)
    return estimate_memory(params, params, lora=False, bf16=True, **kwargs).total


def test_launch_refuses_a_model_too_big_for_every_live_gpu(launch_env, tiny_models):
    model = str(tiny_models["llama"])
    need = _need(tiny_models["llama"])  # about 3.5 MB: bf16 reference ('auto' is bf16 on a GPU)
    _report(launch_env, "small:1", [QUEUE, f"{QUEUE}.gpu"], [need - 1, need // 2])
    _report(launch_env, "stale-big:2", [QUEUE, f"{QUEUE}.gpu"], [10**12], age=121)  # gone: not counted
    _report(launch_env, "other-queue:3", ["another", "another.gpu"], [10**12])  # does not take this run
    with pytest.raises(api.ApiError) as refused:
        api.launch_run({"model": model, "device": "gpu"})
    message = str(refused.value)
    assert message.startswith(
        f"model: the run needs about {gigabytes(need)} for its weights, gradients, "
        "optimizer state and reference (policy "
    )
    assert f"but the largest GPU of the live workers (GPU {need - 1} on small:1) has" in message
    assert "change lora_rank" in message and "precision" not in message and "reward_model" not in message
    with pytest.raises(api.ApiError) as refused:  # device auto: every live worker has a GPU
        api.launch_run({"model": model})
    assert str(refused.value).startswith("model: the run needs")
    with pytest.raises(api.ApiError) as refused:  # fp32: a bigger reference, and precision is named
        api.launch_run({"model": model, "device": "gpu", "precision": "fp32"})
    assert "precision ('bf16'" in str(refused.value)
    assert api.list_runs() == []  # nothing stored


def test_launch_accepts_what_fits_or_cannot_be_judged(launch_env, tiny_models):
    model = str(tiny_models["llama"])
    need = _need(tiny_models["llama"])
    assert api.launch_run({"model": model, "device": "gpu"})["status"] == "queued"  # no worker known
    _report(launch_env, "small:1", [QUEUE, f"{QUEUE}.gpu"], [need - 1])
    assert api.launch_run({"model": model, "device": "cpu"})["status"] == "queued"  # GPUs do not matter
    assert api.launch_run({"model": model, "lora_rank": 4, "device": "gpu"})["status"] == "queued"  # no reference
    assert api.launch_run({"device": "gpu"})["status"] == "queued"  # the built-in model: tiny, not measured
    assert api.launch_run({"model": "Qwen/Qwen2.5-0.5B-Instruct", "device": "gpu"})["status"] == "queued"  # hub id
    _report(launch_env, "cpu:2", [QUEUE, f"{QUEUE}.cpu"], [])
    assert api.launch_run({"model": model})["status"] == "queued"  # device auto: the CPU worker may take it
    with pytest.raises(api.ApiError, match="^model: "):
        api.launch_run({"model": model, "device": "gpu"})  # the CPU worker does not take gpu runs
    _report(launch_env, "big:3", [QUEUE, f"{QUEUE}.gpu"], [need])
    assert api.launch_run({"model": model, "device": "gpu"})["status"] == "queued"  # exactly enough
    assert len(api.list_runs()) == 7


def test_launch_refuses_more_processes_than_a_live_worker_has_gpus(launch_env):
    """devices: a run of N processes trains on N GPUs of one worker; launch refuses it, naming devices, when no live
    worker that would take it has N, and accepts it where one does, on the CPU, or while no GPU worker is known."""
    assert api.launch_run({"devices": 4, "batch_size": 8, "device": "gpu"})["status"] == "queued"  # none known: waits
    _report(launch_env, "two:1", [QUEUE, f"{QUEUE}.gpu"], [10**11, 10**11])
    _report(launch_env, "one:2", [QUEUE, f"{QUEUE}.gpu"], [10**11])
    _report(launch_env, "eight-elsewhere:3", ["another", "another.gpu"], [10**11] * 8)  # does not take this run
    with pytest.raises(api.ApiError) as refused:
        api.launch_run({"devices": 4, "batch_size": 8, "device": "gpu"})
    assert str(refused.value).startswith(
        "devices: 4 processes need 4 GPUs on one worker, but the live workers that would take the run have at most 2 "
        "(two:1); lower devices"
    )
    with pytest.raises(api.ApiError, match="^devices: 4 processes"):  # auto: every live worker has GPUs
        api.launch_run({"devices": 4, "batch_size": 8})
    assert api.launch_run({"devices": 2, "batch_size": 8, "device": "gpu"})["status"] == "queued"  # two:1 has 2
    assert api.launch_run({"devices": 4, "batch_size": 8, "device": "cpu"})["status"] == "queued"  # shares cores
    _report(launch_env, "cpu:4", [QUEUE, f"{QUEUE}.cpu"], [])
    assert api.launch_run({"devices": 4, "batch_size": 8})["status"] == "queued"  # auto: the CPU worker may take it
    assert len(api.list_runs()) == 4


def test_launch_counts_the_learned_reward_model(launch_env, tiny_models):
    model = tiny_models["llama"]
    params, _ = count_parameters(model)
    need = _need(model, rm_params=params)  # the RM starts from the policy's weights
    spec = {"model": str(model), "device": "gpu", "reward": "model"}
    _report(launch_env, "gpu:1", [QUEUE, f"{QUEUE}.gpu"], [need - 1])
    with pytest.raises(api.ApiError) as refused:
        api.launch_run(spec)
    assert "reward model" in str(refused.value) and "or reward_model (a smaller reward model)" in str(refused.value)
    rm_params = count_parameters(tiny_models["qwen2"])[0]  # a local reward model of its own
    _report(launch_env, "gpu:1", [QUEUE, f"{QUEUE}.gpu"], [_need(model, rm_params=rm_params)])
    assert api.launch_run({**spec, "reward_model": str(tiny_models["qwen2"])})["status"] == "queued"


# ---- a real worker process reports itself ---------------------------------------------------------


@pytest.mark.slow
def test_a_worker_process_reports_its_queues_and_gpus(sqlite_url, tmp_path):
    from app.core.broker import worker_queues
    from workers.runner import local_gpus

    queue = f"grpo-test-{uuid.uuid4().hex[:12]}"
    env = {
        **os.environ,
        "GRPO_DATA_DIR": str(tmp_path),
        "GRPO_DATABASE_URL": sqlite_url,
        "GRPO_BROKER_URL": f"sqla+sqlite:///{tmp_path / 'broker.sqlite'}",
        "GRPO_QUEUE": queue,
        "GRPO_LEASE_SECONDS": "4",
    }  # reports every second
    log_path = tmp_path / "worker.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "grpo_dashboard.cli", "worker"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        seen = []
        deadline = time.monotonic() + 90
        while len({w["seen_at"] for w in seen}) < 2:  # its first report, then at least one more
            assert proc.poll() is None, f"worker exited:\n{log_path.read_text(errors='replace')}"
            assert time.monotonic() < deadline, f"no reports:\n{log_path.read_text(errors='replace')}"
            with session_scope(sqlite_url) as s:
                seen += store.live_workers(s, 60)
            time.sleep(0.3)
        gpus = local_gpus()
        for worker in seen:
            assert worker["name"].endswith(f":{proc.pid}")
            assert worker["queues"] == worker_queues(queue, "gpu" if gpus else "cpu")
            assert worker["gpus"] == gpus
    finally:
        stop_process(proc)
