"""precision: where bf16 autocast applies (placement.Precision), on the CPU and on CUDA, and that a bf16 run
keeps the ratio of its first update exactly 1 while it samples in fp32 on the CPU."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_engine.report.recorder import MemoryRecorder
from grpo_engine.rollout.forwards import plan_micro_batches
from grpo_engine.spec.config import validate_spec
from grpo_engine.train import loading
from grpo_engine.train.learner import logprobs
from grpo_engine.train.placement import Precision, cpu_bf16_is_fast, make_accelerator, resolve_precision
from grpo_engine.train.step import reference_and_old_logprobs, sample
from grpo_engine.train.trainer import train

RUN = dict(steps_per_iteration=2, batch_size=2, group_size=4, eval_every=0, max_new_tokens=24)


@pytest.mark.parametrize(
    "precision,device_type,fast,expected",
    [
        ("auto", "cuda", True, Precision("bf16", True)),
        ("auto", "cuda", False, Precision("no", False)),
        ("bf16", "cuda", True, Precision("bf16", True)),
        ("fp32", "cuda", True, Precision("no", False)),
        # the CPU never samples under autocast; bf16 scoring where it has bf16 instructions, or when asked
        ("auto", "cpu", True, Precision("no", True)),
        ("auto", "cpu", False, Precision("no", False)),
        ("bf16", "cpu", False, Precision("no", True)),
        ("fp32", "cpu", True, Precision("no", False)),
    ],
)
def test_precision_resolves_per_device(precision, device_type, fast, expected):
    assert resolve_precision(precision, device_type, fast) == expected


def test_bf16_on_a_gpu_without_it_names_the_key():
    with pytest.raises(ValueError, match="^precision: "):
        resolve_precision("bf16", "cuda", False)


@pytest.mark.parametrize(
    "flags,fast",
    [
        ("fpu avx2 avx512f avx512_vnni", False),  # AVX-512 without BF16: bf16 matmuls are emulated
        ("fpu avx2 avx512f avx512_bf16", True),  # AMD Zen 4, Intel Cooper Lake
        ("fpu avx512f amx_bf16 amx_tile", True),  # Intel Sapphire Rapids
        ("fpu neon asimd", False),
    ],
)
def test_cpu_bf16_speed_is_read_from_the_cpu_flags(flags, fast):
    assert cpu_bf16_is_fast(f"processor\t: 0\nmodel name\t: x\nflags\t\t: {flags}\n\n") is fast
    assert cpu_bf16_is_fast("") is False


def test_accelerate_autocasts_only_on_a_gpu_plan():
    """One worker process runs jobs of different precisions one after another; on the CPU Accelerate never
    autocasts (the sampler's forwards stay fp32), Learner.autocast does."""
    for precision in ("bf16", "fp32", "auto"):
        acc, plan = make_accelerator("cpu", precision)
        assert acc.mixed_precision == "no" and plan.accelerate == "no"
        with acc.autocast():
            assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32


def test_a_bf16_run_samples_in_fp32_and_scores_in_bf16(grpo_cache_dir):
    """precision bf16 on the CPU: sampling's logits are fp32, the log-prob passes' and the update's bf16, the
    frozen reference is bf16; pi_old's log-probs equal the first update's exactly (ratio 1), and the run
    completes with finite losses."""
    spec = validate_spec({**RUN, "precision": "bf16", "policy_updates_per_batch": 2})
    learner = loading.load_learner(spec, MemoryRecorder(), grpo_cache_dir, "cpu")[0]
    assert learner.scoring_bf16 and next(learner.reference.parameters()).dtype == torch.bfloat16
    assert next(learner.unwrapped().parameters()).dtype == torch.float32  # the trained weights stay fp32
    dtypes = []
    hook = (
        learner.unwrapped().get_output_embeddings().register_forward_hook(lambda _m, _i, out: dtypes.append(out.dtype))
    )
    torch.manual_seed(0)
    s = sample(learner, [{"question": "2+3*4", "answer": "14"}, {"question": "7-2", "answer": "5"}])
    assert dtypes and set(dtypes) == {torch.float32}
    dtypes.clear()
    chunks = plan_micro_batches(s.mask, s.prompt_attn, spec.group_size, 3)
    _, old = reference_and_old_logprobs(learner, s, chunks)
    learner.policy.train()
    for mb in chunks:  # what update() runs for its first update, with grad
        with learner.autocast():
            logp, _ = logprobs(learner.policy, mb, s, spec.temperature)
        assert logp.requires_grad and torch.equal(logp.detach(), old[mb.rows])
    assert set(dtypes) == {torch.bfloat16}
    hook.remove()

    rec = MemoryRecorder()
    result = train(spec, rec, grpo_cache_dir, device="cpu")
    assert result.status == "completed"
    assert any("bf16 autocast for scoring and the update, fp32 sampling" in line for line in rec.messages), rec.messages
    assert all(math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"]) for m in rec.metrics)
    fp32 = train(
        validate_spec({**RUN, "precision": "fp32", "steps_per_iteration": 1}),
        MemoryRecorder(),
        grpo_cache_dir,
        device="cpu",
    )
    assert fp32.status == "completed"  # the next job in the same process, in another precision
