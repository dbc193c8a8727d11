"""The run spec's keys: what a GRPO run is launched with.

Every key is defined once, as a field of :class:`RunSpec` (``key``): its type, default, allowed range, the one-line
help the Launch form and the docs show, the form's section and label, and when a run reads it (a rule of
``applicability``). ``FIELDS`` lists them in the form's order. ``config.validate_spec`` builds a checked RunSpec from
JSON. Pure Python (no torch): the web process builds the form and the docs from these.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields as dc_fields
from typing import Any, get_type_hints

from grpo_engine.spec.applicability import (
    DYNAMIC_SAMPLING,
    FORMAT_REWARD,
    HUB_DATASET,
    LEARNED_REWARD,
    OVERLONG,
    OWN_DATASET,
    PRM_DATA,
    PROCESS,
    REWARD_MODEL_START,
    ROLLOUT_LABELS,
    RULE_REWARDS,
    STEP_LABELS,
    Applies,
    step_checker,
)
from grpo_engine.spec.spec_values import BUILTIN_DATASET, BUILTIN_MODEL, MAX_TEXT, Field

# The Launch form's sections, in its order; each key names its own.
MODEL_AND_DATA, ALGORITHM, REWARD, RUNTIME = "Model & data", "Algorithm", "Reward", "Runtime & saving"
SECTIONS = (MODEL_AND_DATA, ALGORITHM, REWARD, RUNTIME)


def key(
    default: Any,
    help: str,
    *,
    section: str,
    fold: bool = False,
    label: str = "",
    applies: Applies | None = None,
    min: float | None = None,
    max: float | None = None,
    choices: tuple | None = None,
    min_exclusive: bool = False,
    max_length: int = MAX_TEXT,
    note: str = "",
):
    """One run-spec key of :class:`RunSpec`: its default, and in the field's metadata its one-line help; the form's
    ``section``, whether it is folded under "More options" (``fold``) and its ``label`` where the key's own words
    would not say it; ``applies``, the rule of when a run reads it (None: always); inclusive bounds
    (``min_exclusive``: the value must be > min), allowed values, for text its longest length, and a ``note`` for the
    docs' "allowed" column on what the rest leaves unsaid (a list's form, a rule between keys)."""
    if section not in SECTIONS:
        raise ValueError(f"unknown section {section!r}")
    metadata = {
        "help": help,
        "section": section,
        "fold": fold,
        "label": label,
        "applies": applies,
        "min": min,
        "max": max,
        "choices": choices,
        "min_exclusive": min_exclusive,
        "max_length": max_length,
        "note": note,
    }
    if isinstance(default, list):  # a list default: each spec gets its own copy
        return field(default_factory=default.copy, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class RunSpec:
    """A run spec: one attribute per key, each with its default, bounds, help and place in the form (``key``).
    ``validate_spec`` builds a checked one from JSON; ``FIELDS`` lists the keys for the launch form, the API and the
    docs."""

    # Model & data
    name: str = key(
        "", "A label for the run; empty picks one from the model and the time.", max_length=200, section=MODEL_AND_DATA
    )
    model: str = key(
        BUILTIN_MODEL,
        f"Policy to train: '{BUILTIN_MODEL}' (built-in tiny model, no download), or a Hugging Face model id or local directory with a causal LM.",
        section=MODEL_AND_DATA,
    )
    dataset: str = key(
        BUILTIN_DATASET,
        f"Questions with reference answers: '{BUILTIN_DATASET}' (built-in arithmetic), a local .jsonl, .csv or "
        ".parquet file (or one uploaded in the Launch tab), or a Hugging Face dataset: a hub id such as "
        "'openai/gsm8k' or a local dataset directory (see dataset_config, dataset_split, eval_split).",
        section=MODEL_AND_DATA,
    )
    prompt_template: str = key(
        "auto",
        "How a question becomes the prompt: 'chat' = the model's chat template (a user turn, then the assistant's "
        "turn opened; for instruct models), 'plain' = the question on its own line (for base models), 'auto' = "
        "'chat' when the tokenizer has a chat template, else 'plain'.",
        choices=("auto", "chat", "plain"),
        section=MODEL_AND_DATA,
        label="Prompt template",
    )
    system_prompt: str = key(
        "",
        "Text the model reads before every question: a system turn through the chat template (prompt_template "
        "'chat'), or text on the line before the question ('plain'); empty = none. Used for training, evaluation, "
        "the reward model and rollout labels alike.",
        max_length=8000,
        section=MODEL_AND_DATA,
        label="System prompt",
    )
    question_template: str = key(
        "",
        "How a question is worded for the model: text holding {question} once, e.g. '{question}\\nLet's think step "
        "by step and output the final answer after \"####\".' (verl's GSM8K instruction); empty = the question as it "
        "is. Applied before prompt_template, everywhere the question is asked.",
        max_length=8000,
        note="holding `{question}` once, or empty",
        section=MODEL_AND_DATA,
        label="Question template ({question} is the question)",
    )
    dataset_config: str = key(
        "",
        "Hugging Face datasets: the configuration to load (e.g. 'main' for openai/gsm8k); empty = the default.",
        section=MODEL_AND_DATA,
        fold=True,
        label="Dataset configuration",
        applies=HUB_DATASET,
    )
    dataset_split: str = key(
        "train", "Hugging Face datasets: the split to train on.", section=MODEL_AND_DATA, fold=True, applies=HUB_DATASET
    )
    eval_split: str = key(
        "",
        "Hugging Face datasets: the split held out for eval/accuracy (e.g. 'test'); empty = the last 10% (at most "
        "200) of the training rows, as for files.",
        section=MODEL_AND_DATA,
        fold=True,
        label="Held-out split",
        applies=HUB_DATASET,
    )
    question_field: str = key(
        "question",
        "The dataset column that holds the question (the prompt).",
        section=MODEL_AND_DATA,
        fold=True,
        applies=OWN_DATASET,
    )
    answer_field: str = key(
        "answer",
        "The dataset column that holds the reference answer: the answer itself, or a whole solution that ends in "
        "'#### <answer>' or holds \\boxed{...} (GSM8K's 'answer', MATH's 'solution').",
        section=MODEL_AND_DATA,
        fold=True,
        applies=OWN_DATASET,
    )
    solution_field: str = key(
        "solution",
        "The dataset column with a step-by-step reference solution (optional).",
        section=MODEL_AND_DATA,
        fold=True,
        applies=OWN_DATASET,
    )

    # Algorithm
    group_size: int = key(
        8,
        "G: outputs sampled per question; advantages are normalised within each group.",
        min=2,
        max=1024,
        section=ALGORITHM,
        label="Group size G",
    )
    batch_size: int = key(
        8,
        "B: questions per step (each step samples B x G outputs).",
        min=1,
        max=4096,
        section=ALGORITHM,
        label="Questions per step B",
    )
    steps_per_iteration: int = key(
        200,
        "M: GRPO steps per iteration (total steps = I x M).",
        min=1,
        max=1_000_000,
        section=ALGORITHM,
        label="Steps per iteration M",
    )
    learning_rate: float = key(
        2e-4,
        "Policy learning rate (AdamW). The default suits the built-in tiny model; use ~1e-6 for 7B models.",
        min=0.0,
        max=1.0,
        min_exclusive=True,
        section=ALGORITHM,
    )
    max_new_tokens: int = key(
        32,
        "Longest completion sampled, in tokens; longer ones are cut and count as truncated.",
        min=1,
        max=32768,
        section=ALGORITHM,
        label="Max new tokens",
    )
    iterations: int = key(
        1,
        "I: outer iterations; the reference is reset to the policy at the start of each.",
        min=1,
        max=1000,
        section=ALGORITHM,
        fold=True,
        label="Iterations I",
    )
    policy_updates_per_batch: int = key(
        1,
        "mu: policy updates on each sampled batch (the clip only binds when mu > 1).",
        min=1,
        max=64,
        section=ALGORITHM,
        fold=True,
        label="Policy updates mu",
    )
    clip_eps: float = key(
        0.2,
        "epsilon: the ratio pi_theta/pi_old is clipped to [1-eps, 1+eps] (or 1+clip_eps_high above).",
        min=0.0,
        max=1.0,
        min_exclusive=True,
        section=ALGORITHM,
        fold=True,
        label="Clip epsilon",
    )
    kl_coef: float = key(
        0.04,
        "beta: weight of the k3 KL penalty against the reference policy (in the loss, not the reward); 0 = no KL "
        "term, and no reference model is loaded (less memory, no reference forward pass).",
        min=0.0,
        max=10.0,
        section=ALGORITHM,
        fold=True,
        label="KL coefficient beta",
    )
    temperature: float = key(
        1.0,
        "Sampling temperature for the G outputs (evaluation is greedy).",
        min=0.0,
        max=10.0,
        min_exclusive=True,
        section=ALGORITHM,
        fold=True,
    )
    top_p: float = key(
        1.0,
        "Nucleus sampling: keep the smallest token set with this much probability.",
        min=0.0,
        max=1.0,
        min_exclusive=True,
        section=ALGORITHM,
        fold=True,
        label="Top-p",
    )
    seed: int = key(
        0, "Random seed for sampling, batching and initialisation.", min=0, max=2**31 - 1, section=ALGORITHM, fold=True
    )
    loss_type: str = key(
        "grpo",
        "How per-token terms become the loss: 'grpo' = mean over each output's tokens, then over outputs (the "
        "paper); 'bnpo' = token mean over each process's outputs; 'dapo' = token mean over the whole batch (DAPO); "
        "'dr_grpo' = token sum / (batch_size x group_size x max_new_tokens) (Dr. GRPO; needs scale_rewards 'none'). "
        "Micro-batches never change it.",
        choices=("grpo", "bnpo", "dapo", "dr_grpo"),
        section=ALGORITHM,
        fold=True,
        label="Loss aggregation",
    )
    scale_rewards: str = key(
        "group",
        "What advantages are divided by: 'group' = the std of the group's rewards (the paper); 'batch' = the std of "
        "all the step's rewards; 'none' = nothing, reward minus the group's mean (Dr. GRPO). Process supervision: "
        "the same for the step rewards.",
        choices=("group", "batch", "none"),
        note="`none` with `loss_type` `dr_grpo`",
        section=ALGORITHM,
        fold=True,
        label="Advantage scaling",
    )
    clip_eps_high: float = key(
        0.0,
        "DAPO's clip-higher: the ratio's upper clip bound is 1 + clip_eps_high, the lower stays 1 - clip_eps "
        "(DAPO uses 0.28 with clip_eps 0.2); 0 = clip_eps, the paper's symmetric clip.",
        min=0.0,
        max=1.0,
        note="0 = `clip_eps`",
        section=ALGORITHM,
        fold=True,
        label="Upper clip epsilon",
    )
    ratio_level: str = key(
        "token",
        "The ratio pi_theta/pi_old: 'token' = one per token (the paper); 'sequence' = GSPO's, one per output: exp of "
        "the mean log-ratio of its tokens, clipped per output (gradients still flow per token).",
        choices=("token", "sequence"),
        section=ALGORITHM,
        fold=True,
        label="Ratio level (token or sequence)",
    )
    lr_warmup_steps: int = key(
        0,
        "Steps over which the learning rate rises linearly to learning_rate (the k-th step of the warm-up trains at "
        "learning_rate x k / lr_warmup_steps); 0 = none. Must be less than the run's total steps.",
        min=0,
        max=1_000_000,
        note="less than the total steps",
        section=ALGORITHM,
        fold=True,
        label="Warm-up steps",
    )
    lr_schedule: str = key(
        "constant",
        "The learning rate after the warm-up: 'constant' = learning_rate (the paper); 'linear' = decays linearly "
        "towards 0 at the end of the run; 'cosine' = along half a cosine towards 0.",
        choices=("constant", "linear", "cosine"),
        section=ALGORITHM,
        fold=True,
        label="Learning-rate schedule",
    )
    skip_zero_spread: bool = key(
        False,
        "DAPO's dynamic sampling: drop the groups whose rewards are all equal (process supervision: all step "
        "rewards; their advantages are 0) and sample groups for more questions instead, up to max_resample extra "
        "draws a step, so each update has batch_size groups that teach something when it can; false = the paper, "
        "every group is trained on.",
        section=ALGORITHM,
        fold=True,
        label="Drop groups with equal rewards (dynamic sampling)",
    )
    max_resample: int = key(
        4,
        "skip_zero_spread only: the most extra draws a step makes, each for as many fresh questions as groups are "
        "missing; still short after them, the step trains on the groups it found (none: no update).",
        min=0,
        max=64,
        note="only with `skip_zero_spread`",
        section=ALGORITHM,
        fold=True,
        label="Extra draws per step",
        applies=DYNAMIC_SAMPLING,
    )
    mask_truncated: bool = key(
        False,
        "Leave outputs cut at max_new_tokens (no end token) out of the loss entirely (DAPO's overlong filtering); "
        "they still count in the rewards, their group's advantages and the reward metrics, and kl, clip_frac and "
        "entropy are then over the tokens the loss counts. false = the paper: every output is trained on.",
        section=ALGORITHM,
        fold=True,
        label="Leave truncated outputs out of the loss",
    )
    overlong_penalty: float = key(
        0.0,
        "DAPO's soft overlong punishment: an output longer than max_new_tokens - overlong_buffer tokens gets a "
        "reward that falls linearly from 0 to -overlong_penalty at max_new_tokens, added to its reward before the "
        "advantages (process supervision: to its last step's reward); 0 = off.",
        min=0.0,
        max=10.0,
        section=ALGORITHM,
        fold=True,
        label="Overlong penalty",
    )
    overlong_buffer: int = key(
        8,
        "overlong_penalty only: Lc, the last tokens before max_new_tokens over which the penalty ramps down; must be "
        "less than max_new_tokens.",
        min=1,
        max=32768,
        note="less than `max_new_tokens`; only with `overlong_penalty`",
        section=ALGORITHM,
        fold=True,
        label="Overlong buffer Lc",
        applies=OVERLONG,
    )

    # Reward
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
        "\\boxed{...}), right or wrong; 0 = none.",
        min=0.0,
        max=10.0,
        section=REWARD,
        label="Format reward",
        applies=FORMAT_REWARD,
    )
    rewards: list = key(
        [],
        'Named rewards, each {"name", "weight"}: an output\'s reward is the weighted sum. Built-ins (outcome): '
        "'accuracy' (the verifier), 'format', 'length' (cosine-scaled), 'repetition' (n-gram penalty); or a custom "
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

    # Runtime & saving
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
        "Processes the run trains on, data-parallel through Accelerate: the worker launches this many, each on its "
        "own GPU (or CPU processes with device 'cpu'); each samples and scores whole groups of batch_size / devices "
        "questions, gradients are averaged, metrics combined. batch_size must be a multiple of it.",
        min=1,
        max=64,
        section=RUNTIME,
        fold=True,
        label="Processes (data-parallel)",
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

    @property
    def total_steps(self) -> int:
        return self.iterations * self.steps_per_iteration

    @property
    def clip_eps_upper(self) -> float:
        """The ratio's upper clip epsilon: ``clip_eps_high``, or ``clip_eps`` when that is 0."""
        return self.clip_eps_high or self.clip_eps

    @property
    def step_checker(self) -> str:
        """What labels steps: 'builtin', 'arithmetic' or 'rollouts' (``step_labels`` 'auto' chosen by the dataset)."""
        return step_checker(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dc_fields(self)}


_TYPES = get_type_hints(RunSpec)
FIELDS: tuple[Field, ...] = tuple(
    Field(f.name, _TYPES[f.name], f.default if f.default_factory is MISSING else f.default_factory(), **f.metadata)
    for f in dc_fields(RunSpec)
)
FIELD_BY_NAME = {f.name: f for f in FIELDS}
DEFAULTS = {f.name: f.default for f in FIELDS}
