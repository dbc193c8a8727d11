"""Short real runs on a CUDA GPU, as a worker on a GPU machine trains them.

Every run has ``device: "auto"`` and no device forced on train(), so the engine picks the GPU itself.
Each variant runs on two models: the built-in one (``grpo_cache_dir``) on builtin-arith, and a tiny
Qwen2 chat model (tests/support/tiny_models.py: ChatML template, <|im_end|> as EOS) on a local JSONL file.
Each run: 2 steps, evaluation at steps 0 and 2, a checkpoint after every step; it must complete with
finite metrics, say in its log that it loaded the model on cuda, have allocated GPU memory, and save
the trained policy.

Marked ``gpu``: where torch sees no CUDA GPU they are skipped (tests/conftest.py), and pytest's -ra
summary says they were not run. On a GPU machine: ``python -m pytest -m gpu -ra`` (or bench/gpu_check.py).
"""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from grpo_engine.report.recorder import MemoryRecorder
from grpo_engine.spec.config import validate_spec
from grpo_engine.train.trainer import train
from tests.support.tiny_models import write_tiny_model

pytestmark = pytest.mark.gpu

STEPS = 2
SHORT = dict(
    device="auto",
    steps_per_iteration=STEPS,
    batch_size=2,
    group_size=4,
    max_new_tokens=16,
    eval_every=2,
    checkpoint_every=1,
    learning_rate=1e-3,
)
VARIANTS = {  # what each run adds to SHORT
    "outcome": {},  # the default supervision, precision auto
    "process": dict(supervision="process"),
    "lora": dict(lora_rank=4),
    "bf16": dict(precision="bf16"),
    "reward-model": dict(reward="model", rm_samples=8),
    "gradient-checkpointing": dict(gradient_checkpointing=True),
    "lora-gradient-checkpointing": dict(lora_rank=4, gradient_checkpointing=True),
    "micro-batches": dict(micro_batch_size=3, policy_updates_per_batch=2),
    "adamw-8bit": dict(optimizer="adamw_8bit"),  # bitsandbytes' CUDA kernels (the CPU ones run in CI)
}
# the run's first log line: "loading model '<model>' on cuda (bf16 mixed precision)" (or cuda:0, or fp32)
LOADING = re.compile(r"loading model .* on (\S+) \((bf16 mixed precision|fp32)\)")
ROWS = [
    {
        "question": f"{a}+{b}*{c}",
        "answer": str(a + b * c),
        "solution": f"{b}*{c}={b * c}\n{a}+{b * c}={a + b * c}\n#### {a + b * c}",
    }
    for a in range(1, 4)
    for b in range(1, 4)
    for c in range(1, 3)
]


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    """(model directory, dataset file): the tiny Qwen2 chat model and a JSONL file of ROWS."""
    root = tmp_path_factory.mktemp("gpu-qwen2")
    data = root / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return write_tiny_model(root / "model", "qwen2"), data


@pytest.fixture(params=["builtin", "qwen2"])
def model_and_data(request, grpo_cache_dir) -> dict:
    if request.param == "builtin":
        return {}  # the defaults: model and dataset builtin-arith
    model, data = request.getfixturevalue("qwen2")
    return {"model": str(model), "dataset": str(data), "format_reward": 0.1}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_short_run_trains_on_the_gpu(variant, model_and_data, grpo_cache_dir, tmp_path):
    spec = validate_spec({**SHORT, **model_and_data, **VARIANTS[variant]})
    torch.cuda.reset_peak_memory_stats()
    recorder = MemoryRecorder()
    result = train(spec, recorder, grpo_cache_dir, checkpoint_dir=tmp_path / "ckpt")

    assert result.status == "completed" and result.step == STEPS, (result, recorder.messages[-5:])
    loading = [match for match in map(LOADING.search, recorder.messages) if match]
    assert loading, recorder.messages[:5]
    device, precision = loading[0].groups()
    assert device.startswith("cuda"), loading[0].string  # the engine picked the GPU itself
    if spec.precision == "bf16" or torch.cuda.is_bf16_supported():
        assert precision == "bf16 mixed precision", loading[0].string
    assert torch.cuda.max_memory_allocated() > 0

    steps = {m["step"]: m for m in recorder.metrics}
    assert sorted(steps) == list(range(STEPS + 1)), sorted(steps)  # step 0: eval/accuracy before training
    for m in recorder.metrics:
        bad = {k: v for k, v in m.items() if not math.isfinite(v)}
        assert not bad, (m["step"], bad)
    for s in range(1, STEPS + 1):
        assert {"loss", "kl", "grad_norm", "reward_mean", "entropy"} <= set(steps[s]), set(steps[s])
    assert 0.0 <= steps[STEPS]["eval/accuracy"] <= 1.0
    if spec.reward == "model":
        assert "rm/loss" in steps[0] and "rm/accuracy_after" in steps[0], steps[0]
    if spec.supervision == "process":
        assert all(sample.step_end_indices is not None for g in recorder.group_log[STEPS] for sample in g.samples)
    group = recorder.group_log[STEPS][0]
    assert len(group.samples) == spec.group_size
    assert all(len(sample.tokens) == len(sample.advantages) <= spec.max_new_tokens for sample in group.samples)

    final = tmp_path / "ckpt" / "final"
    assert (final / "model" / "model.safetensors").is_file()
    if spec.lora_rank:
        assert (final / "adapter").is_dir()


@pytest.mark.parametrize("decode", ["static", "compiled"])
def test_the_fixed_shape_decodes_give_the_default_greedy_outputs_on_the_gpu(decode, grpo_cache_dir):
    """decode 'static' and 'compiled' (torch.compile, CUDA graphs) sample on the GPU what the default loop does,
    greedy, with left padding and groups."""
    from grpo_engine.data.data import load_dataset
    from grpo_engine.model.model import load_policy
    from grpo_engine.rollout.outputs import encode_prompts
    from grpo_engine.rollout.sampling import generate

    model, tokenizer = load_policy("builtin-arith", grpo_cache_dir, torch.device("cuda"))
    model.eval()
    questions = [e["question"] for e in load_dataset("builtin-arith")[1][:12]] + ["3+4", "5-2+7*3-1"]
    prompts = encode_prompts(tokenizer, questions, torch.device("cuda"))
    want = generate(model, tokenizer, prompts, repeat=3, max_new_tokens=40, greedy=True)
    got = generate(model, tokenizer, prompts, repeat=3, max_new_tokens=40, greedy=True, decode=decode)
    assert torch.equal(got, want)
