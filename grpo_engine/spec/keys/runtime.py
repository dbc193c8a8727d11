"""The run spec's "Runtime & saving" keys: where and how a run executes and what it keeps: device, precision, LoRA,
micro-batches, evaluation, checkpoints, recorded groups and trackers.

One field a key (``key``: default, help, bounds, the Launch form's place and label, when a run reads it); RunSpec
(grpo_engine.spec.run_spec) gathers the four sections' keys in the form's order. Pure Python (no torch).
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_engine.spec.applicability import EVALUATING, SAMPLED_EVAL, SEVERAL_PROCESSES
from grpo_engine.spec.keys.field import key
from grpo_engine.spec.words import RUNTIME


@dataclass(frozen=True)
class RuntimeKeys:
    """The Runtime & saving section's keys."""

    device: str = key(
        "auto",
        "Which workers may take the run: 'gpu' = only workers with a CUDA GPU, 'cpu' = only workers without one "
        "(trains on the CPU), 'auto' = any worker (on its GPU if it has one).",
        choices=("auto", "gpu", "cpu"),
        section=RUNTIME,
    )
    precision: str = key(
        "auto",
        "bf16 autocast of the forward passes: 'auto' = bf16 on a GPU that supports it, and on a CPU with bf16 "
        "instructions (AVX-512 BF16 or AMX) for the log-prob passes and the update only (sampling stays fp32 on a "
        "CPU, where it is faster), fp32 otherwise; 'bf16' = the same where the device lacks them (a GPU without "
        "bf16 refuses it); weights and optimizer stay fp32, the frozen reference (and a learned reward model's "
        "frozen prior) are kept in bf16. 'fp32' = no autocast.",
        choices=("auto", "fp32", "bf16"),
        section=RUNTIME,
    )
    lora_rank: int = key(
        0,
        "0 trains every weight; > 0 trains a LoRA adapter of this rank (the reference is the base with the adapter off; each new iteration folds the adapter into the base).",
        min=0,
        max=1024,
        section=RUNTIME,
        label="LoRA rank",
    )
    micro_batch_size: int = key(
        0,
        "Outputs per forward / backward pass in the policy update and for the reference's log-probs; the gradient "
        "is accumulated over these micro-batches, so memory stays bounded whatever group_size x batch_size. "
        "0 = all B x G at once.",
        min=0,
        max=1_000_000,
        section=RUNTIME,
        fold=True,
        label="Micro-batch size",
    )
    gradient_checkpointing: bool = key(
        False,
        "Recompute each layer's activations in the backward pass instead of keeping them: much less activation "
        "memory for long outputs or large micro-batches, at about a third more update time.",
        section=RUNTIME,
        fold=True,
    )
    optimizer: str = key(
        "adamw",
        "The policy's optimizer: 'adamw' = torch's AdamW, two fp32 moments (8 bytes a trainable parameter); "
        "'adamw_8bit' = bitsandbytes' AdamW8bit, the moments quantized block-wise to 8 bits (2 bytes a trainable "
        "parameter; tensors under 4,096 values keep fp32 moments), where bitsandbytes is installed on the worker "
        "(pip install 'grpo-dashboard[8bit]'). The same betas, epsilon and no weight decay; a learned reward model "
        "keeps AdamW.",
        choices=("adamw", "adamw_8bit"),
        note="`adamw_8bit` where bitsandbytes is installed",
        section=RUNTIME,
        fold=True,
        label="Optimizer",
    )
    decode: str = key(
        "dynamic",
        "How the sampler decodes: 'dynamic' = a KV cache that grows by a token per step, outputs that ended dropped "
        "from the batch; 'static' = a KV cache and mask of fixed size (prompt + max_new_tokens), every output "
        "decoded to the end; 'compiled' = 'static' with its decode step through torch.compile (CUDA graphs on a GPU; "
        "the first step compiles it). Greedy outputs are the same with each.",
        choices=("dynamic", "static", "compiled"),
        section=RUNTIME,
        fold=True,
        label="Sampler decode loop",
    )
    devices: int = key(
        1,
        "Processes the run trains on, launched by the worker through Accelerate, each on its own GPU (or CPU "
        "processes with device 'cpu'); each samples and scores whole groups of batch_size / devices questions, "
        "gradients are averaged, metrics combined. Each holds the whole policy, or its share with sharding 'fsdp'. "
        "batch_size must be a multiple of it.",
        min=1,
        max=64,
        section=RUNTIME,
        fold=True,
        label="Processes",
    )
    sharding: str = key(
        "none",
        "How the run's processes hold the policy: 'none' = each holds all of it (data parallelism: weights, gradients "
        "and optimizer state on every process); 'fsdp' = fully sharded through torch's FSDP2: each process holds 1 / "
        "devices of the weights, gradients and optimizer state, and of the frozen reference; a forward gathers one "
        "layer at a time, the sampler gathers the weights once per sampling (in bf16 on a GPU). For models whose "
        "full fine-tune does not fit one device.",
        choices=("none", "fsdp"),
        section=RUNTIME,
        fold=True,
        label="Sharding",
        applies=SEVERAL_PROCESSES,
    )
    eval_every: int = key(
        10,
        "Evaluate held-out greedy accuracy (metric eval/accuracy) every this many steps, and after the last; 0 = never.",
        min=0,
        max=1_000_000,
        section=RUNTIME,
        fold=True,
        label="Evaluate every",
    )
    eval_samples: int = key(
        0,
        "Besides the greedy output, sample this many outputs (K) per held-out question at each evaluation and record "
        "pass@k and maj@k for k = 1, 2, 4, ... up to K (DeepSeekMath's Figure 7: RL raises Maj@K, not Pass@K). "
        "0 = greedy only. Costs K times the greedy evaluation's sampling.",
        min=0,
        max=64,
        section=RUNTIME,
        fold=True,
        label="Sampled outputs per held-out question",
        applies=EVALUATING,
    )
    eval_temperature: float = key(
        0.7,
        "Sampling temperature of the evaluation's K sampled outputs (eval_samples).",
        min=0.0,
        max=10.0,
        min_exclusive=True,
        section=RUNTIME,
        fold=True,
        label="Evaluation temperature",
        applies=SAMPLED_EVAL,
    )
    checkpoint_every: int = key(
        10,
        "Save a checkpoint (policy or LoRA adapter, optimizer, random states, reference, reward model) every this "
        "many steps; a run whose worker dies resumes from its last one. 0 = never (it restarts from step 1).",
        min=0,
        max=1_000_000,
        section=RUNTIME,
        fold=True,
        label="Checkpoint every",
    )
    checkpoint_keep: int = key(
        2,
        "How many of the latest checkpoints are kept on disk.",
        min=1,
        max=1000,
        section=RUNTIME,
        fold=True,
        label="Checkpoints kept",
    )
    record_every: int = key(
        1,
        "Record the sampled groups (completions, rewards, per-token advantages) every this many steps, and at the "
        "last step; 0 = never. Metrics are recorded every step.",
        min=0,
        max=1_000_000,
        section=RUNTIME,
        fold=True,
        label="Record groups every",
    )
    report_to: list = key(
        [],
        "Trackers that also receive every metric at each step and a table of the recorded groups: any of "
        "'tensorboard', 'mlflow', 'wandb' (a list, or names separated by commas); each library must be installed "
        "where the run is launched and on the worker (pip install 'grpo-dashboard[trackers]'). Empty = only this "
        "dashboard.",
        note="a list of `tensorboard`, `mlflow`, `wandb`, each at most once and installed on the worker; or text, the names separated by commas; see docs/coming-from-trl-verl.md, Your own tracker",
        section=RUNTIME,
        fold=True,
        label="Also report to (tensorboard, mlflow, wandb)",
    )
