"""One trial of bench/vs_trl.py: one trainer (this engine, or TRL's GRPOTrainer) on one configuration, in a fresh
Python process, and what each of its steps processed.

    python -m bench.vs_trl_trials TRIAL_JSON    # what run_child starts: prints RESULT and the result as JSON

A trial's settings (``t``) are bench/vs_trl.py's: the configuration's B, G, max new tokens, beta, epsilon,
temperature, top-p, learning rate, seed, steps, ``chat``, ``decode``, ``dataset`` and ``question_template``
(builtin-arith and none, unless the configuration names them), and the trial's ``variant`` ("engine off",
"engine on", "trl"), ``model_dir``, ``device`` and ``record``. Its result: each step's wall time and completion
tokens, the tokens its model was fed per step (prefill, decode, each training forward: counted as that
docstring's "work of a step" says), the engine's phase times, and the training's memory.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import StepTimer, json_child, peak_rss, recorder_for, reset_peak_rss  # torch-free
from bench.vs_trl_models import prompt_text  # torch is imported inside its functions

RESULT = "VS_TRL_RESULT "  # a trial's stdout line with its JSON result (TRL prints its logs there too)
PHASES = ("time/sampling", "time/scoring", "time/update")  # the engine's step phases, from its metrics


class TrainingMemory:
    """Peak memory from ``reset()`` (called once set-up is done, before the first step) to ``peak()``."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.before = 0  # bytes held at reset(): RSS on the CPU, allocated on the GPU

    def reset(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.before = torch.cuda.memory_allocated()
        else:
            self.before = reset_peak_rss()  # VmHWM := current RSS

    def peak(self) -> int:
        if self.cuda:
            import torch

            return torch.cuda.max_memory_allocated()
        return peak_rss()


def engine_trial(t: dict) -> dict:
    """grpo_engine.train.trainer.train on the trial's settings, recording into a fresh store (t["record"]) or nowhere."""
    from transformers import AutoTokenizer

    from grpo_engine.data.data import load_dataset
    from grpo_engine.spec.config import validate_spec
    from grpo_engine.train.trainer import train

    cuda = t["device"] == "cuda"
    chat = t.get("chat", False)
    dataset, template = t.get("dataset", "builtin-arith"), t.get("question_template", "")
    spec = validate_spec(
        {
            "model": t["model_dir"],
            "dataset": dataset,
            "question_template": template,
            "batch_size": t["batch_size"],
            "group_size": t["group_size"],
            "max_new_tokens": t["max_new_tokens"],
            "kl_coef": t["beta"],
            "policy_updates_per_batch": 1,
            "clip_eps": t["epsilon"],
            "temperature": t["temperature"],
            "top_p": t["top_p"],
            "learning_rate": t["learning_rate"],
            "steps_per_iteration": t["steps"],
            "iterations": 1,
            "eval_every": 0,
            "record_every": 1,
            "checkpoint_every": 0,
            "seed": t["seed"],
            "device": "gpu" if cuda else "cpu",
            "precision": "bf16" if cuda else "fp32",
            "prompt_template": "chat" if chat else "auto",
            "decode": t.get("decode", "dynamic"),
        }
    )
    # prompt tokens of each question (for the step's work: the prompt text both sides get, as the engine encodes
    # it), counted before training
    tokenizer = AutoTokenizer.from_pretrained(t["model_dir"])
    prompt_len = {
        e["question"]: len(
            tokenizer(prompt_text(tokenizer, e["question"], chat, template), add_special_tokens=False)["input_ids"]
        )
        for e in load_dataset(dataset)[0]
    }
    memory = TrainingMemory(cuda)

    class Timer(StepTimer):
        """StepTimer that also resets the memory peak at start and keeps what each step processed."""

        def __init__(self, inner):
            super().__init__(inner)
            self.work: list[dict[str, int]] = []  # per step: the tokens fed to the model (engine_step_tokens)
            self.metrics: list[dict[str, float]] = []

        def start(self, total_steps: int) -> None:
            memory.reset()
            super().start(total_steps)

        def groups(self, step, groups) -> None:
            lengths = [len(s.tokens) for g in groups for s in g.samples]  # each completion's tokens, its EOS included
            self.work.append(engine_step_tokens([prompt_len[g.prompt] for g in groups], lengths, spec.max_new_tokens))
            super().groups(step, groups)

        def step(self, step: int, iteration: int, metrics: dict[str, float]) -> None:
            self.metrics.append({k: metrics[k] for k in ("completion_len", *PHASES)})
            super().step(step, iteration, metrics)

    with recorder_for(spec, t["record"], "vs-trl") as (inner, _, _):  # the store, as the worker records
        timer = Timer(inner)
        result = train(spec, timer, Path(t["cache_dir"]), device=None if cuda else "cpu")
        timer.finish()  # the writes still queued at the end count in the last step
        peak = memory.peak()
        assert result.status == "completed", result
    assert len(timer.work) == len(timer.step_seconds), (len(timer.work), len(timer.step_seconds))
    n = spec.batch_size * spec.group_size
    return {
        "step_seconds": timer.step_seconds,
        "completion_tokens": [round(m["completion_len"] * n) for m in timer.metrics],
        **work_series(timer.work, spec.kl_coef > 0),
        **{f"{phase[5:]}_seconds": [m[phase] for m in timer.metrics] for phase in PHASES},
        "trajectory": timer.trajectory,
        "recording_seconds": sum(timer.recording_seconds.values()),
        "memory_before": memory.before,
        "memory_peak": peak,
    }


def trl_config(t: dict, out_dir: str):
    """TRL's GRPOConfig for the trial's settings: each option set to what the engine does, and why."""
    from trl import GRPOConfig

    cuda = t["device"] == "cuda"
    return GRPOConfig(
        output_dir=out_dir,
        # Batch sizes: in GRPOConfig they count completions, not prompts. generation_batch_size =
        # per_device_train_batch_size x processes x steps_per_generation = B*G completions = B prompts x G,
        # generated once per optimizer step (gradient_accumulation_steps 1, steps_per_generation 1).
        per_device_train_batch_size=t["batch_size"] * t["group_size"],
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_generations=t["group_size"],
        num_iterations=1,  # mu
        max_completion_length=t["max_new_tokens"],
        temperature=t["temperature"],
        top_p=t["top_p"],
        top_k=0,  # no top-k filtering
        beta=t["beta"],
        epsilon=t["epsilon"],
        loss_type="grpo",  # each sequence's token mean, then the mean over sequences (the paper's Eq. 3)
        scale_rewards="group",  # advantages divided by the std within each group
        use_bias_correction_kl=False,  # the paper's k3 KL term, not multiplied by the (differentiable) ratio
        learning_rate=t["learning_rate"],
        lr_scheduler_type="constant",  # the engine keeps the rate constant (TRL's default decays it linearly)
        optim="adamw_torch",  # torch.optim.AdamW as the engine has it (transformers' default: the fused variant)
        weight_decay=0.0,
        max_grad_norm=1.0,
        max_steps=t["steps"],
        seed=t["seed"],
        activation_checkpointing=False,  # TRL's default (gradient_checkpointing) is on; the engine keeps activations
        bf16=cuda,  # TRL's default is on, even on the CPU
        use_cpu=not cuda,
        use_vllm=False,
        report_to="none",
        save_strategy="no",
        eval_strategy="no",
        logging_steps=1,  # metrics every step, as the engine reports them
        log_completions=False,
        disable_tqdm=True,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
    )


def trl_trial(t: dict) -> dict:
    """trl.GRPOTrainer on the trial's settings (trl_config), with the engine's questions, prompts and verifier."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOTrainer

    from grpo_engine.data.data import load_dataset
    from grpo_engine.rewards.rewards import outcome_reward

    cuda = t["device"] == "cuda"
    n = t["batch_size"] * t["group_size"]
    tokenizer = AutoTokenizer.from_pretrained(t["model_dir"])  # pads on the left, pad token <pad>
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(t["model_dir"], use_safetensors=True)  # fp32, as the engine loads it
    chat, template = t.get("chat", False), t.get("question_template", "")
    dataset = Dataset.from_list(
        [
            {"prompt": prompt_text(tokenizer, e["question"], chat, template), "answer": e["answer"]}
            for e in load_dataset(t.get("dataset", "builtin-arith"))[0]
        ]
    )
    completion_tokens: list[int] = []
    work: list[dict[str, int]] = []  # per step: the tokens fed to the model (trl_step_tokens)
    prompt_len: dict[str, int] = {}  # prompt text -> its tokens, counted as the engine counts them

    def verifier(prompts, completions, completion_ids, answer, **_) -> list[float]:
        """The engine's verifier. TRL passes the prompts' text, the dataset's other columns (answer) and each
        completion's token ids up to and including its first EOS, which count the step's completion tokens as
        the engine does, and its work."""
        assert len(completions) == n, f"{len(completions)} completions in a step, expected B x G = {n}"
        lengths = list(map(len, completion_ids))
        completion_tokens.append(sum(lengths))
        for p in set(prompts) - prompt_len.keys():  # TRL tokenizes with special tokens: neither tokenizer adds any
            prompt_len[p] = len(tokenizer(p, add_special_tokens=False)["input_ids"])
        work.append(trl_step_tokens([prompt_len[p] for p in prompts], lengths))
        return [outcome_reward(c, a)[0] for c, a in zip(completions, answer, strict=True)]

    memory = TrainingMemory(cuda)
    step_seconds: list[float] = []

    class StepClock(TrainerCallback):
        """Wall time between the ends of successive optimizer steps (the first from on_train_begin)."""

        def on_train_begin(self, args, state, control, **kwargs):
            memory.reset()
            self.last = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            now = time.perf_counter()
            step_seconds.append(now - self.last)
            self.last = now

    out_dir = tempfile.mkdtemp(prefix="grpo-vs-trl-out-")
    config = trl_config(t, out_dir)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=verifier,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[StepClock()],
    )
    try:
        trainer.train()
        peak = memory.peak()
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    assert len(step_seconds) == len(completion_tokens) == t["steps"], (len(step_seconds), len(completion_tokens))
    return {
        "step_seconds": step_seconds,
        "completion_tokens": completion_tokens,
        **work_series(work, t["beta"] > 0),
        "memory_before": memory.before,
        "memory_peak": peak,
    }


def run_trial(t: dict) -> dict:
    result = trl_trial(t) if t["variant"] == "trl" else engine_trial(t)
    if t["device"] == "cuda":
        import torch

        result["device_name"] = torch.cuda.get_device_name()
    return result


def run_child(trial: dict) -> dict:
    """run_trial in a fresh Python process; its result is the stdout line after RESULT."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}  # no network at all
    what = f"the {trial['variant']} trial of {trial['config']}"
    return json_child("bench.vs_trl_trials", json.dumps(trial), prefix=RESULT, env=env, what=what)


# ---- the work of a step -----------------------------------------------------------------------------------


def decoded_tokens(lengths: list[int], max_new_tokens: int, prune_share: float) -> int:
    """Tokens the engine's sampler decodes for completions of ``lengths`` (their EOS included; a completion cut
    at max_new_tokens has that length): one per row of the decoded batch and step, replaying
    grpo_engine.rollout.sampling._decode's loop, which stops when every row has ended or at max_new_tokens and drops
    the rows that ended once they are at least ``prune_share`` of the rows it decodes. The first step's token
    comes from the prefill's logits, so the decode forwards take N tokens fewer (TRL's count is made the same way).

    Example: lengths [1, 1, 1, 4], share 0.25: step 1 samples 4 rows, 3 end and are dropped; steps 2-4 one row
    each: 7 (16 without dropping).
    """
    rows, total = list(lengths), 0
    for t in range(1, max_new_tokens + 1):  # t tokens sampled per row once this step is done
        total += len(rows)
        live = [length for length in rows if length > t]
        if not live or t == max_new_tokens:
            break
        if len(live) <= (1 - prune_share) * len(rows):  # the sampler's rule: drop the rows that have ended
            rows = live
    return total


def engine_step_tokens(prompt_lens: list[int], lengths: list[int], max_new_tokens: int) -> dict[str, int]:
    """Tokens the engine feeds its model in a step of B prompts (``prompt_lens``, real tokens) and N completions
    (``lengths``, EOS included; bench/vs_trl.py's docstring): prefill B x P, decode (decoded_tokens), and each
    training forward (the reference's, the update's) B x P + N x T, one micro-batch holding all N."""
    from grpo_engine.rollout.sampling import PRUNE_SHARE

    prefill = len(prompt_lens) * max(prompt_lens)
    return {
        "prefill": prefill,
        "decode": decoded_tokens(lengths, max_new_tokens, PRUNE_SHARE),
        "forward": prefill + len(lengths) * max(lengths),
    }


def trl_step_tokens(prompt_lens: list[int], lengths: list[int]) -> dict[str, int]:
    """Tokens TRL feeds its model in a step of N prompts (``prompt_lens``, each of the B repeated G times) and N
    completions (``lengths``, EOS included; bench/vs_trl.py's docstring): prefill N x P, decode N x T (HF generate
    decodes every row until the last has ended), and each training forward N x (P + T) (both padded to the
    longest)."""
    n, p, t = len(lengths), max(prompt_lens), max(lengths)
    return {"prefill": n * p, "decode": n * t, "forward": n * (p + t)}


def work_series(work: list[dict[str, int]], reference: bool) -> dict:
    """A trial's per-step token counts as the result's series (prefill_tokens, ...), and whether it ran a
    reference forward (beta > 0)."""
    return {
        **{f"{k}_tokens": [w[k] for w in work] for k in ("prefill", "decode", "forward")},
        "reference_pass": reference,
    }


if __name__ == "__main__":
    print(RESULT + json.dumps(run_trial(json.loads(sys.argv[1]))), flush=True)
