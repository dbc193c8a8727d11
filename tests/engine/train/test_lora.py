"""LoRA runs (lora_rank > 0) of grpo_engine.train.trainer.train on the built-in model, recorded in memory.

The trainer wraps the policy in a peft LoRA adapter; the reference policy is the same model with
the adapter disabled (no second copy of the weights). The run's peft model is caught by wrapping
``loading.wrap_lora`` (the real one still does the work) so the tests can look at it afterwards.
"""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file

from grpo_engine.model.model import builtin_model_dir, load_policy
from grpo_engine.report.metrics import EVAL_METRICS, METRICS
from grpo_engine.report.recorder import MemoryRecorder
from grpo_engine.rollout import sampling
from grpo_engine.rollout.outputs import token_logprobs
from grpo_engine.rollout.tokenization import completion_mask
from grpo_engine.spec.config import SpecError, validate_spec
from grpo_engine.train import loading, step, trainer

SPEC = dict(
    lora_rank=4, iterations=1, steps_per_iteration=4, batch_size=2, group_size=4, eval_every=0, max_new_tokens=24
)


@pytest.fixture(scope="module")
def lora_run(grpo_cache_dir):
    """(result, recorder, the trained peft model) of a 4-step LoRA run."""
    wrapped, real_wrap = [], loading.wrap_lora

    def catch(policy, rank):
        wrapped.append(real_wrap(policy, rank))
        return wrapped[-1]

    recorder = MemoryRecorder()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loading, "wrap_lora", catch)
        result = trainer.train(validate_spec(SPEC), recorder, grpo_cache_dir, device="cpu")
    assert len(wrapped) == 1
    return result, recorder, wrapped[0]


def test_lora_run_completes_and_records_every_metric(lora_run):
    result, rec, _ = lora_run
    assert result.status == "completed" and result.step == 4
    steps = {m["step"]: m for m in rec.metrics}
    assert sorted(steps) == [1, 2, 3, 4]
    assert [steps[s]["iteration"] for s in (1, 2, 3, 4)] == [1, 1, 1, 1]
    for s in (1, 2, 3, 4):
        assert set(METRICS) - {*EVAL_METRICS, "time/eval"} <= set(steps[s]), set(METRICS) - set(
            steps[s]
        )  # eval_every=0
        assert all(math.isfinite(v) for v in steps[s].values())
    # the adapter starts as the identity (lora_B = 0): the policy is the reference at step 1
    assert steps[1]["kl"] == pytest.approx(0.0, abs=1e-6)
    assert sorted(rec.group_log) == [1, 2, 3, 4]


def test_only_the_adapter_is_trained(lora_run, grpo_cache_dir):
    _, _, peft_model = lora_run
    trainable = {name: p for name, p in peft_model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in name or ".lora_B." in name for name in trainable)
    n_trainable = sum(p.numel() for p in trainable.values())
    n_base = sum(p.numel() for name, p in peft_model.named_parameters() if not p.requires_grad)
    assert n_trainable < 0.1 * n_base
    # lora_B starts at zero; every one moved
    assert all(p.abs().sum() > 0 for name, p in trainable.items() if ".lora_B." in name)

    # the base weights are still exactly the saved built-in model's
    saved = load_file(builtin_model_dir(grpo_cache_dir) / "model.safetensors")
    base = {
        name.removeprefix("base_model.model.").replace(".base_layer.", "."): t
        for name, t in peft_model.state_dict().items()
        if ".lora_" not in name
    }
    assert set(saved) <= set(base)
    for name, tensor in saved.items():
        assert torch.equal(base[name], tensor), name


def test_reference_is_the_base_model_with_the_adapter_disabled(lora_run, grpo_cache_dir):
    _, _, peft_model = lora_run
    base, tokenizer = load_policy("builtin-arith", grpo_cache_dir, torch.device("cpu"))
    peft_model.eval()
    base.eval()
    prompts = step.encode_prompts(tokenizer, ["2+3*4", "6-1*5", "4*4+1"], "cpu")
    torch.manual_seed(0)
    completions = sampling.generate(peft_model, tokenizer, prompts, repeat=4, max_new_tokens=24, greedy=False)
    mask, _ = completion_mask(completions, tokenizer.eos_token_id)
    ids = prompts["input_ids"].repeat_interleave(4, dim=0)
    attn = prompts["attention_mask"].repeat_interleave(4, dim=0)

    with torch.no_grad():
        base_logp = token_logprobs(base, ids, attn, completions, mask)[0] * mask
        with peft_model.disable_adapter():
            ref_logp = token_logprobs(peft_model, ids, attn, completions, mask)[0] * mask
        policy_logp = token_logprobs(peft_model, ids, attn, completions, mask)[0] * mask
    torch.testing.assert_close(ref_logp, base_logp, rtol=0, atol=1e-5)
    # with the adapter on (again), the trained policy differs from the base
    assert (policy_logp - base_logp).abs().max() > 1e-4


def test_lora_rank_goes_through_validation():
    assert validate_spec({"lora_rank": 4}).lora_rank == 4
    assert validate_spec({"lora_rank": "8"}).lora_rank == 8
    assert validate_spec({}).lora_rank == 0  # full fine-tuning by default
    for bad in (-1, 1025, 2.5, True, "four"):
        with pytest.raises(SpecError) as err:
            validate_spec({"lora_rank": bad})
        assert err.value.key == "lora_rank"


def test_each_iteration_folds_the_adapter_into_a_new_reference(grpo_cache_dir):
    """Algorithm 1's reference reset with LoRA: the adapter is merged into the base (the new reference)
    and a fresh adapter starts, so the policy equals the reference again at the first step of iteration 2."""
    spec = validate_spec({**SPEC, "iterations": 2, "steps_per_iteration": 2})
    rec = MemoryRecorder()
    result = trainer.train(spec, rec, grpo_cache_dir, device="cpu")
    assert result.status == "completed"
    steps = {m["step"]: m for m in rec.metrics}
    assert [steps[s]["iteration"] for s in (1, 2, 3, 4)] == [1, 1, 2, 2]
    assert steps[1]["kl"] == pytest.approx(0.0, abs=1e-6)
    assert steps[3]["kl"] == pytest.approx(0.0, abs=1e-6)
