"""Checkpoints and resume in the engine: a run paused and resumed continues exactly as if it had never
stopped (same metrics, step for step, on the CPU), for full fine-tuning, LoRA across a reference
reset, a learned reward model and 8-bit AdamW (optimizer adamw_8bit, bitsandbytes on the CPU); old checkpoints are
pruned; the final policy is saved loadable.

Short real runs of grpo_engine.train.trainer.train on the built-in model (``grpo_cache_dir`` fixture).
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from grpo_engine.report.recorder import MemoryRecorder
from grpo_engine.spec.config import validate_spec
from grpo_engine.train import checkpoint
from grpo_engine.train.trainer import train
from tests.support.runs import BASE, PauseAt, assert_same_metrics, metrics_by_step, straight_and_resumed


class LostAt(PauseAt):
    """Says "lost" (its worker is gone, or another worker took the run over) once step ``at`` is recorded."""

    def should_stop(self):
        return "lost" if super().should_stop() else False


def test_an_attempt_that_lost_its_run_writes_no_checkpoint(grpo_cache_dir, tmp_path):
    """Lost while step 2 ran: the attempt ends that step but leaves the checkpoint directory, from which a fresh
    worker may already be resuming, alone; it stops at the step boundary."""
    lost = LostAt(2)
    result = train(validate_spec(BASE), lost, grpo_cache_dir, device="cpu", checkpoint_dir=tmp_path)
    assert result.status == "cancelled" and result.step == 2
    assert lost.checkpoints == [] and checkpoint.latest(tmp_path) is None
    paused = PauseAt(2)  # the same boundary with "pause" does save
    train(validate_spec(BASE), paused, grpo_cache_dir, device="cpu", checkpoint_dir=tmp_path / "paused")
    assert paused.checkpoints == [2]


def test_full_finetune_resumes_exactly(grpo_cache_dir, tmp_path):
    straight, first, second = straight_and_resumed(grpo_cache_dir, tmp_path, pause_at=3)
    assert_same_metrics(straight, first, second, pause_at=3)
    assert first.checkpoints == [2, 3] and second.checkpoints == [4]


def test_full_finetune_resumes_in_the_second_iteration_with_its_reference(grpo_cache_dir, tmp_path):
    straight, first, second = straight_and_resumed(
        grpo_cache_dir, tmp_path, pause_at=5, iterations=2, steps_per_iteration=3
    )
    assert_same_metrics(straight, first, second, pause_at=5)
    assert checkpoint.step_dirs(tmp_path / "straight") == []  # a completed run keeps only its final policy


def test_lora_resumes_exactly_across_the_reference_reset(grpo_cache_dir, tmp_path):
    straight, first, second = straight_and_resumed(
        grpo_cache_dir, tmp_path, pause_at=4, lora_rank=4, iterations=2, steps_per_iteration=3, learning_rate=1e-3
    )
    assert_same_metrics(straight, first, second, pause_at=4)


def test_8bit_adamw_keeps_8bit_moments_and_resumes_exactly(grpo_cache_dir, tmp_path):
    """optimizer adamw_8bit trains with bitsandbytes' AdamW8bit: its checkpoint holds the moments of the larger
    tensors as 8-bit codes (uint8, with their block scales), and a paused run resumes from them exactly."""
    pytest.importorskip("bitsandbytes", reason="bitsandbytes (the test extra installs it) runs AdamW8bit")
    spec = validate_spec({**BASE, "optimizer": "adamw_8bit", "steps_per_iteration": 2})
    assert train(spec, PauseAt(1), grpo_cache_dir, device="cpu", checkpoint_dir=tmp_path / "paused").step == 1
    tensors = load_file(checkpoint.latest(tmp_path / "paused")[1] / "optimizer.safetensors")
    scales = [name[: -len("absmax1")] for name in tensors if name.endswith("/absmax1")]  # the 8-bit tensors' blocks
    assert scales and all(tensors[f"{n}state{k}"].dtype == torch.uint8 for n in scales for k in (1, 2))
    straight, first, second = straight_and_resumed(grpo_cache_dir, tmp_path, pause_at=3, optimizer="adamw_8bit")
    assert_same_metrics(straight, first, second, pause_at=3)


def test_learned_reward_model_resumes_exactly(grpo_cache_dir, tmp_path):
    straight, first, second = straight_and_resumed(
        grpo_cache_dir,
        tmp_path,
        pause_at=3,
        reward="model",
        rm_samples=16,
        iterations=3,
        steps_per_iteration=2,
        eval_every=0,
    )
    assert_same_metrics(straight, first, second, pause_at=3)
    assert "rm/accuracy_after" in metrics_by_step(second)[4]  # the refresh after iteration 2 ran after the resume
    assert "rm/accuracy_after" not in metrics_by_step(second)[6]  # none after the last iteration


def test_only_the_newest_checkpoints_are_kept_and_written_whole(grpo_cache_dir, tmp_path):
    spec = validate_spec({**BASE, "checkpoint_every": 1, "checkpoint_keep": 2, "steps_per_iteration": 5})
    recorder = PauseAt(4)
    train(spec, recorder, grpo_cache_dir, device="cpu", checkpoint_dir=tmp_path)
    assert [step for step, _ in checkpoint.step_dirs(tmp_path)] == [3, 4]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]
    latest = checkpoint.latest(tmp_path)[1]
    assert sorted(p.name for p in latest.iterdir()) == [
        "optimizer.safetensors",
        "policy.safetensors",
        "rng.safetensors",
        "state.json",
    ]
    (tmp_path / "step-00000009").mkdir()  # an incomplete checkpoint (no state.json) is never picked
    assert checkpoint.latest(tmp_path)[0] == 4


def test_final_policy_is_a_loadable_model_and_lora_also_an_adapter(grpo_cache_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from grpo_engine.model.model import builtin_model_dir

    spec = validate_spec({**BASE, "steps_per_iteration": 2, "lora_rank": 4, "eval_every": 0, "learning_rate": 1e-2})
    train(spec, PauseAt(None), grpo_cache_dir, device="cpu", checkpoint_dir=tmp_path)
    assert checkpoint.step_dirs(tmp_path) == []  # step checkpoints go once the run is complete
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "final" / "model")
    assert (tmp_path / "final" / "adapter" / "adapter_model.safetensors").is_file()
    assert not list((tmp_path / "final").rglob("*.bin"))  # safetensors only
    assert json.loads((tmp_path / "final" / "policy.json").read_text()) == {"source_dtype": "float32"}  # built-in
    # one iteration: the starting model plus the adapter is the merged model
    start = AutoModelForCausalLM.from_pretrained(builtin_model_dir(grpo_cache_dir))
    adapted = PeftModel.from_pretrained(start, tmp_path / "final" / "adapter").eval()
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        assert torch.allclose(merged.eval()(input_ids=ids).logits, adapted(input_ids=ids).logits, atol=1e-4)
        with adapted.disable_adapter():  # the run trained: the adapter changes the starting model
            start_logits = adapted(input_ids=ids).logits
        assert not torch.allclose(start_logits, adapted(input_ids=ids).logits, atol=1e-4)


def test_everything_reported_is_flushed_before_each_checkpoint(grpo_cache_dir, tmp_path):
    """A recorder that writes in the background is flushed before a checkpoint is saved, so a run resumed
    from that checkpoint never misses a step reported before it."""

    class Events(MemoryRecorder):
        def __init__(self):
            super().__init__()
            self.events = []

        def step(self, step, iteration, metrics):
            super().step(step, iteration, metrics)
            self.events.append(("step", step))

        def flush(self):
            self.events.append(("flush", None))

        def checkpoint(self, step, path):
            assert checkpoint.latest(tmp_path / "run")[0] == step
            self.events.append(("checkpoint", step))

    recorder = Events()
    train(
        validate_spec({**BASE, "eval_every": 0}),
        recorder,
        grpo_cache_dir,
        device="cpu",
        checkpoint_dir=tmp_path / "run",
    )
    assert [e for e in recorder.events if e[0] == "checkpoint"] == [("checkpoint", 2), ("checkpoint", 4)]
    for k, event in enumerate(recorder.events):
        if event[0] == "checkpoint":  # right before it: step k's report, then the flush
            assert recorder.events[k - 2 : k] == [("step", event[1]), ("flush", None)]


@pytest.mark.parametrize("lora_rank", [0, 4], ids=["full", "lora"])
def test_a_checkpoints_policy_becomes_a_model_that_answers_as_the_run_did(grpo_cache_dir, tmp_path, lora_rank):
    """What ``model: run:<id>@<step>`` loads: the policy of a kept checkpoint as a model directory, its logits those
    of the policy the run held at that step (the adapter merged, for LoRA), not the starting model's."""
    from grpo_engine.model.model import load_policy
    from grpo_engine.report.run_files import checkpoint_at
    from grpo_engine.train.loading import wrap_lora

    spec = validate_spec({**BASE, "lora_rank": lora_rank, "learning_rate": 1e-2 if lora_rank else 1e-4})
    train(spec, PauseAt(2), grpo_cache_dir, device="cpu", checkpoint_dir=tmp_path / "run")
    found = checkpoint_at(tmp_path / "run", 2)
    checkpoint.save_policy_at(spec, found, tmp_path / "at", grpo_cache_dir, log=lambda _: None)
    assert json.loads((tmp_path / "at" / "policy.json").read_text()) == {"source_dtype": "float32"}
    cpu = torch.device("cpu")
    saved = load_policy(str(tmp_path / "at" / "model"), grpo_cache_dir, cpu)[0].eval()
    held = load_policy(spec.model, grpo_cache_dir, cpu)[0]
    held = (wrap_lora(held, lora_rank) if lora_rank else held).eval()
    checkpoint.load_policy_weights(found, checkpoint.read_state(found), held)
    start = load_policy(spec.model, grpo_cache_dir, cpu)[0].eval()
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        assert torch.allclose(saved(input_ids=ids).logits, held(input_ids=ids).logits, atol=1e-4)
        assert not torch.allclose(saved(input_ids=ids).logits, start(input_ids=ids).logits, atol=1e-4)
