"""The run spec's "Reward" keys: how outputs are rewarded: outcome or process supervision, the rule's verifier and named
rewards, step labels, and a learned reward model.

One field a key (``key``: default, help, bounds, the Launch form's place and label, when a run reads it); RunSpec
(grpo_engine.spec.run_spec) gathers the four sections' keys in the form's order. Pure Python (no torch).
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_engine.spec.applicability import (
    FORMAT_REWARD,
    LEARNED_REWARD,
    PRM_DATA,
    PROCESS,
    REWARD_MODEL_START,
    ROLLOUT_LABELS,
    RULE_REWARDS,
    STEP_LABELS,
)
from grpo_engine.spec.keys.field import key
from grpo_engine.spec.words import REWARD


@dataclass(frozen=True)
class RewardKeys:
    """The Reward section's keys."""

    supervision: str = key(
        "outcome",
        "'outcome': one reward per output (paper 4.1.2); 'process': one reward per reasoning step (4.1.3).",
        choices=("outcome", "process"),
        section=REWARD,
    )
    reward: str = key(
        "rule",
        "'rule': the verifier (outcome) or step checker (process); 'model': a learned ORM / PRM.",
        choices=("rule", "model"),
        section=REWARD,
    )
    answer_match: str = key(
        "strict",
        "Which final answers the reward counts: 'strict' = only one stated as '#### <answer>' (the last line) or "
        "\\boxed{...}; 'flexible' = also the last number in the output (lm-eval's flexible extraction). "
        "Evaluation records both (eval/accuracy_strict, eval/accuracy_flexible) and eval/format whatever this is.",
        choices=("strict", "flexible"),
        section=REWARD,
        label="Answers counted",
    )
    format_reward: float = key(
        0.0,
        "Outcome reward added when an output states a final answer in the expected form ('#### <answer>' or "
        "\\boxed{...}), right or wrong; 0 = none. It pays a bare '#### 7' too: a small instruct model can collect it "
        "without working and stop answering right (accuracy falls while eval/format rises); the named rewards "
        "'strict_correct' and 'format_after_working' pay the form only with a right answer or after some working.",
        min=0.0,
        max=10.0,
        section=REWARD,
        label="Format reward",
        applies=FORMAT_REWARD,
    )
    rewards: list = key(
        [],
        'Named rewards, each {"name", "weight"}: an output\'s reward is the weighted sum. Built-ins (outcome): '
        "'accuracy' (the verifier), 'format', 'strict_correct' (a right answer stated as '####' or \\boxed), "
        "'format_after_working' (the strict form after 5 or more words), 'length' (cosine-scaled), 'repetition' "
        "(n-gram penalty); or a custom "
        "function 'module:function' or '/path/file.py:function' (GRPO_ALLOW_CUSTOM_REWARDS); with supervision "
        "'process', only custom functions returning one number per step. Empty = the verifier plus format_reward.",
        note='a list of `{"name", "weight"}`; see docs/data-and-rewards.md',
        section=REWARD,
        label="Named rewards (JSON list)",
        applies=RULE_REWARDS,
    )
    step_labels: str = key(
        "auto",
        "Process supervision: how the rules label each step (the rule reward, and a learned PRM's training labels): "
        "'builtin' = the built-in task's exact checker (builtin-arith only); 'arithmetic' = every equation in the "
        "step must be true (exact rational arithmetic; GSM8K's <<48/2=24>>, LaTeX, units and $ understood; a step "
        "with none counts as right), and the last step must state the right final answer; 'rollouts' = "
        "Math-Shepherd: the policy continues the output label_rollouts times from the end of each step, and the "
        "step is labelled by whether they reach the reference answer (label_estimate); 'auto' = 'builtin' on "
        "builtin-arith, else 'rollouts'.",
        choices=("auto", "builtin", "arithmetic", "rollouts"),
        section=REWARD,
        fold=True,
        label="Step labels",
        applies=STEP_LABELS,
    )
    label_rollouts: int = key(
        4,
        "step_labels 'rollouts': N, the continuations sampled from the end of each step (each step of each output "
        "costs N more samples).",
        min=1,
        max=64,
        section=REWARD,
        fold=True,
        label="Rollouts per step N",
        applies=ROLLOUT_LABELS,
    )
    label_estimate: str = key(
        "hard",
        "step_labels 'rollouts': 'hard' = a step is right (1) when any of its N continuations reaches the answer; "
        "'soft' = its label is the share that do.",
        choices=("hard", "soft"),
        section=REWARD,
        fold=True,
        label="Rollout estimate",
        applies=ROLLOUT_LABELS,
    )
    label_completer: str = key(
        "",
        "step_labels 'rollouts': the model that continues each step; empty = the current policy. Or a Hugging Face "
        "model id or local directory with a causal LM (a stronger model of the task, frozen): it reads the question "
        "through its own chat template and the output so far as text.",
        note="only with step labels `rollouts`",
        section=REWARD,
        fold=True,
        label="Rollout completer",
        applies=ROLLOUT_LABELS,
    )
    step_delimiter: str = key(
        "\\n",
        "Process supervision: the text that ends a reasoning step in an output, with \\n for a newline (the "
        "default) and \\t for a tab; e.g. Math-Shepherd's step tag 'ки'.",
        section=REWARD,
        fold=True,
        applies=PROCESS,
    )
    reward_model: str = key(
        "",
        "reward: model only. Where the reward model's transformer starts: empty = the policy model's weights "
        "(with a fresh scoring head), or a Hugging Face model id or local directory with a causal LM.",
        note="no spaces; empty unless `reward` is `model`",
        section=REWARD,
        fold=True,
        label="Reward model start",
        applies=REWARD_MODEL_START,
    )
    rm_data: str = key(
        "",
        "reward: model with process supervision only. A warm start for the PRM: step-labelled solutions in "
        "Math-Shepherd's format, a local .jsonl or .parquet file, or a Hugging Face dataset id such as "
        "'peiyi9979/Math-Shepherd', whose rows hold 'input' (steps each ending in the tag 'ки') and 'label' (each tag "
        "replaced by + or -). The PRM's first training takes rm_samples of its rows; each refresh trains on the "
        "policy's own samples labelled by step_labels, replaying earlier data (rm_replay_ratio).",
        note="only with `reward` `model` and `supervision` `process`",
        section=REWARD,
        fold=True,
        label="PRM training data",
        applies=PRM_DATA,
    )
    rm_samples: int = key(
        2048,
        "reward: model only. Fresh policy outputs sampled and labelled for the reward model's first training and for "
        "each refresh; a quarter as many, on held-out questions, measure its accuracy.",
        min=8,
        max=1_000_000,
        section=REWARD,
        fold=True,
        label="Reward model samples",
        applies=LEARNED_REWARD,
    )
    rm_learning_rate: float = key(
        1e-3,
        "Learning rate (AdamW) of the learned reward model (reward: model). The default suits the built-in tiny model; use ~1e-5 for large models.",
        min=0.0,
        max=1.0,
        min_exclusive=True,
        section=REWARD,
        fold=True,
        label="Reward model learning rate",
        applies=LEARNED_REWARD,
    )
    rm_replay_ratio: float = key(
        0.1,
        "Share of earlier reward-model data replayed when the RM is refreshed after an iteration.",
        min=0.0,
        max=1.0,
        section=REWARD,
        fold=True,
        label="Reward model replay ratio",
        applies=LEARNED_REWARD,
    )
