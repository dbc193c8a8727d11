"""sharding 'fsdp': 2 CPU processes (gloo) launched by the worker through Accelerate, the policy and the reference
sharded by torch's FSDP2, driven by ``execute_run`` in this process on a fresh SQLite store (as test_distributed.py).

A sharded run must train what the same run unsharded trains. With 2 processes the sums agree: a gradient is averaged
over the processes by a reduce-scatter instead of an all-reduce, (a + b) / 2 either way, which is exact in binary
floating point for two terms, and the forwards run on the same weights. What can differ is fp32 round-off: the
gradient norm is summed per shard and then across the processes (another order of the same squares), and a CPU's
matmul kernels may round a forward on FSDP2's gathered buffers otherwise than on the plain parameters. On the AMD EPYC
this was written on the metrics agreed within 1e-7 and the weights within 1e-8; on an Intel Xeon with AMX the metrics
came 1e-6 apart by step 3 and, from the reference reset at step 4 (KL and grad_norm 2.7e-5 and 1.1e-5 relative), the
final weights up to 1.3e-5 apart: AdamW divides each gradient by its own running scale, so a round-off in a weight's
near-zero gradient moves that weight by up to a learning rate (here 2e-4) per step. The comparison runs in fp32
(``precision: fp32``): under bf16 autocast such a difference can flip one bf16 rounding of a log-prob (2^-8 relative),
which shows in the loss and KL (bench/sharding_memory.py measured 3.6e-3 relative on SmolLM2 at step 5). The
tolerances allow those fp32 differences and no more: 1e-4 relative on the metrics, or 1e-7 absolute for a metric that
is a near-cancelling sum of terms of order 1 (the loss was -3.7e-4 at step 5, 4e-9 apart); 5e-5 absolute on the
weights, a quarter of the learning rate. A sampled token that changed would move the rewards, the KL and the loss by
far more.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from app import store
from app.core.settings import get_settings
from app.service.run_models import kept_steps
from app.store.db import session_scope
from grpo_engine.spec.config import validate_spec
from grpo_engine.spec.words import SpecError
from tests.support.distributed import COMPARED, create_run, pause_after_step, stored_metrics
from tests.support.tiny_models import write_tiny_model
from workers.run_models import run_model_to_load
from workers.runner import execute_run

SPEC = {
    "steps_per_iteration": 3,
    "iterations": 2,
    "batch_size": 4,
    "group_size": 4,
    "max_new_tokens": 32,
    "eval_every": 5,
    "checkpoint_every": 2,
    "devices": 2,
    "device": "cpu",
    "seed": 3,
    "micro_batch_size": 4,
    "policy_updates_per_batch": 2,
    "precision": "fp32",
}
RELATIVE = 1e-4  # on each metric (see the module docstring)
ABSOLUTE = 1e-7  # on each metric: a near-cancelling sum of terms of order 1, as the loss can be
WEIGHTS = 5e-5  # on each weight of the final policy: a quarter of SPEC's learning rate (2e-4)


def _final_weights(tmp_path, run_id: int) -> dict[str, torch.Tensor]:
    return load_file(tmp_path / "checkpoints" / f"run-{run_id}" / "final" / "model" / "model.safetensors")


def _close(a: list[dict], b: list[dict]) -> None:
    assert [m["step"] for m in a] == [m["step"] for m in b]
    for x, y in zip(a, b, strict=True):
        for k in COMPARED:
            assert (k in x) == (k in y), (x["step"], k)
            if k in x:
                assert x[k] == pytest.approx(y[k], rel=RELATIVE, abs=ABSOLUTE), (x["step"], k, x[k], y[k])


@pytest.mark.slow
def test_a_sharded_run_trains_what_data_parallelism_trains_and_resumes_exactly(store_url, tmp_path):  # noqa: F811
    """The same seed with sharding 'none' and 'fsdp', over two iterations (the sharded reference reset to the policy
    at step 4): the same metrics step for step and the same final policy (saved by the sharded run as one ordinary
    model directory); a sharded run paused in its second iteration, after a checkpoint holding the sharded
    reference, and resumed records what the uninterrupted sharded run records."""
    plain = create_run(store_url, SPEC)
    assert execute_run(plain) == "completed"
    sharded = create_run(store_url, {**SPEC, "sharding": "fsdp"})
    assert execute_run(sharded) == "completed"
    with session_scope(store_url) as s:
        logs = store.get_logs(s, sharded, 200)
    assert any("sharding the policy and the reference across 2 processes" in line for line in logs), logs
    expected = stored_metrics(store_url, sharded)
    _close(expected, stored_metrics(store_url, plain))
    ours, theirs = _final_weights(tmp_path, sharded), _final_weights(tmp_path, plain)
    assert ours.keys() == theirs.keys()
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], rtol=0, atol=WEIGHTS, msg=name)

    paused = create_run(store_url, {**SPEC, "sharding": "fsdp"})

    assert pause_after_step(store_url, paused, 4) == "paused"
    with session_scope(store_url) as s:
        assert store.get_run(s, paused)["checkpoint_step"] >= 4  # in iteration 2: the reference is in it
    _a_sharded_checkpoint_is_the_model_a_plain_one_is(store_url, paused)
    assert execute_run(paused) == "completed"
    with session_scope(store_url) as s:
        assert any("resuming from the checkpoint" in line for line in store.get_logs(s, paused, 200))
    assert stored_metrics(store_url, paused) == expected


def _a_sharded_checkpoint_is_the_model_a_plain_one_is(store_url, sharded: int) -> None:
    """``model: run:<id>@<step>`` of a sharded run's checkpoint: offered, and made one model directory from the
    processes' shards, whose weights are those the data-parallel run held at the same step."""
    plain = create_run(store_url, SPEC)
    assert pause_after_step(store_url, plain, 4) == "paused"
    step = max(set(kept_steps(sharded)) & set(kept_steps(plain)))
    assert step >= 4
    made = {}
    for run_id in (sharded, plain):
        spec = run_model_to_load(validate_spec({**SPEC, "model": f"run:{run_id}@{step}"}), get_settings(), log=print)
        made[run_id] = load_file(Path(spec.model) / "model.safetensors")
    assert made[sharded].keys() == made[plain].keys()
    for name in made[plain]:
        torch.testing.assert_close(made[sharded][name], made[plain][name], rtol=0, atol=WEIGHTS, msg=name)


def test_sharding_is_refused_where_it_cannot_run():
    """fsdp needs several processes; 8-bit moments do not shard."""
    assert validate_spec({"devices": 2, "sharding": "fsdp"}).sharding == "fsdp"
    for spec, key in (
        ({"sharding": "fsdp"}, "sharding"),
        ({"devices": 2, "sharding": "fsdp", "optimizer": "adamw_8bit"}, "optimizer"),
    ):
        with pytest.raises(SpecError) as refused:
            validate_spec(spec)
        assert refused.value.key == key


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra",
    [
        {
            "lora_rank": 4,
            "supervision": "process",
            "reward": "model",
            "rm_samples": 16,
            "iterations": 2,
            "steps_per_iteration": 3,
        },
    ],
    ids=["lora-learned-prm"],
)
def test_sharded_runs_with_lora_learned_reward_models_and_reference_resets(store_url, tmp_path, extra):  # noqa: F811
    """A sharded LoRA run over two iterations with process supervision and a learned PRM (trained on the main process,
    which samples with the gathered policy, and refreshed between the iterations; the adapter folded into the base and
    the base sharded again at the reference reset), in precision auto."""
    spec = {**SPEC, "sharding": "fsdp", "precision": "auto", **extra}  # auto: bf16 scoring where the CPU has it
    run_id = create_run(store_url, spec)
    assert execute_run(run_id) == "completed"
    with session_scope(store_url) as s:
        metrics = store.get_metrics(s, run_id)
    total = spec["iterations"] * spec["steps_per_iteration"]
    assert [m["step"] for m in metrics] == list(range(total + 1))  # step 0: the reward model's first training
    assert all(m["kl"] >= 0 and m["grad_norm"] >= 0 for m in metrics[1:])
    final = tmp_path / "checkpoints" / f"run-{run_id}" / "final"
    assert (final / "model" / "model.safetensors").is_file()
    assert (final / "adapter").is_dir() == ("lora_rank" in extra)


@pytest.mark.gpu
@pytest.mark.slow
def test_a_sharded_run_on_two_gpus_trains_in_bf16_and_matches_its_metrics_shape(store_url, tmp_path):  # noqa: F811
    """On a machine with 2 CUDA GPUs (bench/gpu_check.py runs it): NCCL, FSDP2's bf16 MixedPrecisionPolicy and the
    sampler's bf16 gathered weights, which the CPU runs above cannot reach. A 1-GPU machine skips it, saying so."""
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 CUDA GPUs, this machine has {torch.cuda.device_count()}")
    run_id = create_run(store_url, {**SPEC, "device": "gpu", "precision": "auto", "sharding": "fsdp"})
    assert execute_run(run_id) == "completed"
    with session_scope(store_url) as s:
        metrics = store.get_metrics(s, run_id)
        logs = store.get_logs(s, run_id, 200)
    assert [m["step"] for m in metrics] == list(range(SPEC["steps_per_iteration"] + 1))
    assert any("peak GPU memory per process while training" in line for line in logs), logs
    assert (tmp_path / "checkpoints" / f"run-{run_id}" / "final" / "model" / "model.safetensors").is_file()


@pytest.mark.slow
def test_only_the_main_process_reads_the_whole_model(store_url, tmp_path, monkeypatch):  # noqa: F811
    """A sharded run's second process builds the model on the meta device and receives only its shards from the main
    process: at the end of loading its peak resident memory is below the main process's (which held the whole policy
    and the whole reference) by at least half the model's fp32 size. Read from both processes whole, it would be about
    the same. The model is a Llama of about 100M parameters (400 MB in fp32), so that the difference stands far
    above what else the two processes hold differently (the main one records to the store). The processes' C
    allocator hands every block over 128 KiB back to the system when it is freed (MALLOC_MMAP_THRESHOLD_), so the peak
    is what a process held at once, not what glibc kept of the tensors it freed (which varies with the threads' timing)."""
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")  # inherited by the run's processes
    model = write_tiny_model(
        tmp_path / "models" / "wide-llama", "llama", hidden_size=1024, intermediate_size=4096, num_hidden_layers=6
    )
    fp32_bytes = (model / "model.safetensors").stat().st_size
    assert fp32_bytes > 300e6
    spec = {
        **SPEC,
        "model": str(model),
        "sharding": "fsdp",
        "steps_per_iteration": 1,
        "iterations": 1,
        "batch_size": 2,
        "group_size": 2,
        "max_new_tokens": 4,
        "eval_every": 0,
        "checkpoint_every": 0,
        "policy_updates_per_batch": 1,
    }
    run_id = create_run(store_url, spec)
    assert execute_run(run_id) == "completed"
    with session_scope(store_url) as s:
        logs = store.get_logs(s, run_id, 200)
    line = next(line for line in logs if "peak resident memory per process while loading" in line)
    main, other = (float(x.split()[0]) * 1e9 for x in line.split(": ", 1)[1].split(", "))
    assert main - other > 0.5 * fp32_bytes, line
