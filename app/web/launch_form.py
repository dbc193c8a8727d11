"""The Launch form's layout, as data: which section each run-spec key sits in, which keys are shown at once and
which are folded under "More options", when a key applies, the label a user reads, and the presets.

Pure (no Gradio): app.web.tabs.launch builds the components from it, and tests check that every RunSpec key appears
exactly once and that every preset is a valid run spec.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from grpo_engine.spec.config import BUILTIN_DATASET, FIELDS, labelled_by_rollouts
from grpo_engine.data.data import DATASET_SUFFIXES


@dataclass(frozen=True)
class Section:
    """One part of the form: its title, the keys shown at once and the keys folded under "More options"."""

    title: str
    essential: tuple[str, ...]
    more: tuple[str, ...]


SECTIONS = (
    Section(
        "Model & data",
        ("name", "model", "dataset", "prompt_template", "system_prompt", "question_template"),
        ("dataset_config", "dataset_split", "eval_split", "question_field", "answer_field", "solution_field"),
    ),
    Section(
        "Algorithm",
        ("group_size", "batch_size", "steps_per_iteration", "learning_rate", "max_new_tokens"),
        (
            "iterations",
            "policy_updates_per_batch",
            "clip_eps",
            "kl_coef",
            "temperature",
            "top_p",
            "seed",
            "loss_type",
            "scale_rewards",
            "clip_eps_high",
            "ratio_level",
            "lr_warmup_steps",
            "lr_schedule",
            "skip_zero_spread",
            "max_resample",
            "mask_truncated",
            "overlong_penalty",
            "overlong_buffer",
        ),
    ),
    Section(
        "Reward",
        ("supervision", "reward", "answer_match", "format_reward", "rewards"),
        (
            "step_labels",
            "label_rollouts",
            "label_estimate",
            "label_completer",
            "step_delimiter",
            "reward_model",
            "rm_data",
            "rm_samples",
            "rm_learning_rate",
            "rm_replay_ratio",
        ),
    ),
    Section(
        "Runtime & saving",
        ("device", "precision", "lora_rank"),
        (
            "micro_batch_size",
            "gradient_checkpointing",
            "decode",
            "devices",
            "eval_every",
            "checkpoint_every",
            "checkpoint_keep",
            "record_every",
            "report_to",
        ),
    ),
)

# Labels where the key, spaced and capitalised, would not say it (the key is shown beside every label).
LABELS = {
    "prompt_template": "Prompt template",
    "system_prompt": "System prompt",
    "question_template": "Question template ({question} is the question)",
    "answer_match": "Answers counted",
    "dataset_config": "Dataset configuration",
    "eval_split": "Held-out split",
    "group_size": "Group size G",
    "batch_size": "Questions per step B",
    "steps_per_iteration": "Steps per iteration M",
    "max_new_tokens": "Max new tokens",
    "iterations": "Iterations I",
    "policy_updates_per_batch": "Policy updates mu",
    "clip_eps": "Clip epsilon",
    "kl_coef": "KL coefficient beta",
    "top_p": "Top-p",
    "format_reward": "Format reward",
    "rewards": "Named rewards (JSON list)",
    "loss_type": "Loss aggregation",
    "scale_rewards": "Advantage scaling",
    "clip_eps_high": "Upper clip epsilon",
    "ratio_level": "Ratio level (token or sequence)",
    "lr_warmup_steps": "Warm-up steps",
    "lr_schedule": "Learning-rate schedule",
    "skip_zero_spread": "Drop groups with equal rewards (dynamic sampling)",
    "max_resample": "Extra draws per step",
    "mask_truncated": "Leave truncated outputs out of the loss",
    "overlong_penalty": "Overlong penalty",
    "overlong_buffer": "Overlong buffer Lc",
    "step_labels": "Step labels",
    "label_rollouts": "Rollouts per step N",
    "label_estimate": "Rollout estimate",
    "label_completer": "Rollout completer",
    "reward_model": "Reward model start",
    "rm_data": "PRM training data",
    "rm_samples": "Reward model samples",
    "rm_learning_rate": "Reward model learning rate",
    "rm_replay_ratio": "Reward model replay ratio",
    "lora_rank": "LoRA rank",
    "micro_batch_size": "Micro-batch size",
    "devices": "Processes (data-parallel)",
    "decode": "Sampler decode loop",
    "eval_every": "Evaluate every",
    "checkpoint_every": "Checkpoint every",
    "checkpoint_keep": "Checkpoints kept",
    "record_every": "Record groups every",
    "report_to": "Also report to (tensorboard, mlflow, wandb)",
}


def label(key: str) -> str:
    """What the form calls a key, with the key itself for API users: 'Group size G · group_size'.

    >>> label("group_size"), label("seed")
    ('Group size G · group_size', 'Seed · seed')
    """
    words = LABELS.get(key) or key.replace("_", " ").capitalize()
    return f"{words} · {key}"


def _own_dataset(values: dict) -> bool:
    """Whether the dataset is anything but the built-in one (its columns then matter)."""
    return (values.get("dataset") or BUILTIN_DATASET) != BUILTIN_DATASET


def _hub_dataset(values: dict) -> bool:
    """Whether the dataset is read through Hugging Face datasets (a hub id or a dataset directory, not a .jsonl,
    .csv or .parquet file): its configuration and splits then matter."""
    return _own_dataset(values) and not str(values.get("dataset")).strip().lower().endswith(DATASET_SUFFIXES)


def _learned_reward(values: dict) -> bool:
    """Whether the run learns a reward model (reward: model)."""
    return values.get("reward") == "model"


def _rollouts(values: dict) -> bool:
    """Whether steps are labelled by rollouts (grpo_engine.spec.spec_checks.labelled_by_rollouts, the validator's
    rule), with the form's ``rewards`` box (a JSON list) read as names."""
    rewards = values.get("rewards") if values.get("reward") != "model" else None
    if isinstance(rewards, str):
        try:
            rewards = json.loads(rewards) if rewards.strip() else []
        except ValueError:
            rewards = [rewards]  # unreadable: launch refuses it, naming rewards
    return labelled_by_rollouts(
        values.get("supervision"), values.get("step_labels") or "auto", not _own_dataset(values), rewards or []
    )


# When a key applies, from the form's other values; a key not here always applies.
APPLIES = {
    "dataset_config": _hub_dataset,
    "dataset_split": _hub_dataset,
    "eval_split": _hub_dataset,
    "question_field": _own_dataset,
    "answer_field": _own_dataset,
    "solution_field": _own_dataset,
    "format_reward": lambda v: v.get("supervision") != "process",
    "rewards": lambda v: v.get("reward") != "model",
    "step_delimiter": lambda v: v.get("supervision") == "process",
    "step_labels": lambda v: v.get("supervision") == "process",
    "label_rollouts": _rollouts,
    "label_estimate": _rollouts,
    "label_completer": _rollouts,
    "reward_model": _learned_reward,
    "rm_samples": _learned_reward,
    "rm_learning_rate": _learned_reward,
    "rm_replay_ratio": _learned_reward,
    "rm_data": lambda v: _learned_reward(v) and v.get("supervision") == "process",
    "max_resample": lambda v: bool(v.get("skip_zero_spread")),
    "overlong_buffer": lambda v: bool(v.get("overlong_penalty")),
}
# The keys whose value decides whether another key applies: the form re-checks when one of them changes.
DECIDING = ("dataset", "supervision", "reward", "rewards", "step_labels", "skip_zero_spread", "overlong_penalty")


def applies(key: str, values: dict) -> bool:
    """Whether ``key`` means anything for a run spec with these ``values`` (hidden in the form when not).

    >>> applies("rm_samples", {"reward": "rule"}), applies("rm_samples", {"reward": "model"})
    (False, True)
    >>> applies("step_delimiter", {"supervision": "process"}), applies("group_size", {})
    (True, True)
    """
    rule = APPLIES.get(key)
    return rule is None or bool(rule(values))


def applicable(spec: dict) -> dict:
    """The keys of a form's ``spec`` that apply to its values (:func:`applies`): a hidden key is left out, so it takes
    its default instead of a value the user can no longer see.

    >>> applicable({"supervision": "outcome", "step_labels": "rollouts", "group_size": 4})
    {'supervision': 'outcome', 'group_size': 4}
    """
    return {k: v for k, v in spec.items() if applies(k, spec)}


def section_of(key: str) -> int:
    """The index in SECTIONS of the section holding ``key``."""
    return next(i for i, s in enumerate(SECTIONS) if key in s.essential or key in s.more)


# verl's GSM8K instruction: the answer after "####", the form the strict answer match reads
GSM8K_INSTRUCTION = '{question}\nLet\'s think step by step and output the final answer after "####".'

PRESETS = {
    "Built-in demo (CPU, minutes)": {},
    "GSM8K with a 0.5B instruct model (GPU)": {
        "name": "qwen0.5b-gsm8k",
        "model": "Qwen/Qwen2.5-0.5B-Instruct",
        "dataset": "openai/gsm8k",
        "dataset_config": "main",
        "dataset_split": "train",
        "eval_split": "test",
        "prompt_template": "auto",
        "question_template": GSM8K_INSTRUCTION,
        "format_reward": 0.1,
        "group_size": 8,
        "batch_size": 16,
        "max_new_tokens": 300,
        "learning_rate": 1e-6,
        "steps_per_iteration": 500,
        "eval_every": 25,
        "checkpoint_every": 25,
        "device": "gpu",
        "micro_batch_size": 16,
        "gradient_checkpointing": True,
    },
    "Process supervision with a learned PRM (built-in)": {
        "name": "builtin-prm",
        "supervision": "process",
        "reward": "model",
        "iterations": 2,
        "steps_per_iteration": 100,
        "rm_samples": 1024,
    },
}


def preset_values(preset: str) -> list:
    """The form's values (in FIELDS order) for a preset: the defaults with the preset's keys over them."""
    chosen = PRESETS[preset]
    return [chosen.get(f.name, f.default) for f in FIELDS]
