"""The rules between keys, checked on the built spec: each refusal a SpecError that names the key to change.

``check_spec`` runs them all, in this order: every key's applicability (a value other than the default where no run
with these values reads the key: its rule in RunSpec's metadata, ``applicability``), then the rules on what the keys'
values are together. ``check_budget`` is the worker's token budget, which launch and the worker each apply with their
own setting. Pure Python (no torch).
"""

from __future__ import annotations

from grpo_engine.rewards.reward_functions import check_rewards_apply
from grpo_engine.spec.one_key import check_optimizer, check_prompt_keys
from grpo_engine.spec.run_spec import DEFAULTS, FIELDS, RunSpec
from grpo_engine.spec.words import BUILTIN_DATASET, RUN_MODEL_PREFIX, SpecError, run_model_id, shown

MAX_TOTAL_STEPS = 1_000_000  # iterations x steps_per_iteration
RM_TOKEN_FACTOR = 8  # a reward model's (re)training may sample this many steps' worth of tokens


def check_spec(spec: RunSpec) -> None:
    """Refuse (SpecError naming the key) a spec whose keys do not go together."""
    check_applicability(spec)
    if spec.step_labels == "builtin" and spec.dataset != BUILTIN_DATASET:
        raise SpecError(
            "step_labels",
            f"'builtin' checks only the built-in task's questions, but dataset is {shown(spec.dataset)}: every step "
            "would be labelled wrong; use 'arithmetic' or 'rollouts' (or 'auto')",
        )
    try:
        check_rewards_apply(spec.rewards, spec.supervision)
    except ValueError as e:
        raise SpecError("rewards", str(e)) from None
    if spec.loss_type == "dr_grpo" and spec.scale_rewards != "none":
        raise SpecError(
            "scale_rewards",
            f"must be 'none' with loss_type 'dr_grpo' (Dr. GRPO divides advantages by no standard deviation), got "
            f"{shown(spec.scale_rewards)}; set scale_rewards to 'none' or choose another loss_type",
        )
    if spec.batch_size % spec.devices:
        raise SpecError(
            "devices",
            f"batch_size {spec.batch_size} must be a multiple of devices {spec.devices}: each process takes whole "
            "groups of an equal share of the questions",
        )
    if spec.sharding == "fsdp":
        _check_sharding(spec)
    if spec.total_steps > MAX_TOTAL_STEPS:
        raise SpecError(
            "steps_per_iteration",
            f"iterations x steps_per_iteration = {spec.total_steps:,} steps, more than {MAX_TOTAL_STEPS:,}",
        )
    _check_run_models(spec)
    for name in ("reward_model", "label_completer"):
        if any(c.isspace() for c in getattr(spec, name)):
            raise SpecError(name, f"must be a Hugging Face model id or a local directory, got {getattr(spec, name)!r}")
    _check_lengths(spec)
    if spec.evaluates_only:
        _check_evaluation_only(spec)
    check_prompt_keys(spec.to_dict())
    check_optimizer(spec.optimizer)


def check_applicability(spec: RunSpec) -> None:
    """Refuse, naming the key, a value other than the key's default where its rule says the run does not read it
    (the value would silently do nothing); the Launch form hides the key there, by the same rule."""
    values = spec.to_dict()
    for f in FIELDS:
        if f.applies is not None and values[f.name] != DEFAULTS[f.name] and not f.applies(values):
            raise SpecError(f.name, f.applies.refusal(values))


def _check_run_models(spec: RunSpec) -> None:
    """Refuse, naming the key, a malformed ``run:<id>[@<step>]`` model, and one where only ``model`` may name a run. (Whether
    the run exists and has a trained policy is launch's check, against the store: app.service.run_models.)"""
    if spec.model.strip().startswith(RUN_MODEL_PREFIX) and run_model_id(spec.model) is None:
        raise SpecError(
            "model",
            "'run:<id>' names a run's trained policy by the run's number, 'run:<id>@<step>' the policy of one of its "
            f"checkpoints, got {shown(spec.model)}",
        )
    for name in ("reward_model", "label_completer"):
        if getattr(spec, name).strip().startswith(RUN_MODEL_PREFIX):
            raise SpecError(
                name, f"only model may name a run's trained policy (run:<id>), got {shown(getattr(spec, name))}"
            )


def _check_evaluation_only(spec: RunSpec) -> None:
    """Refuse, naming the key, what an evaluation-only run (steps_per_iteration 0) cannot do: evaluate without
    eval_every, or train a reward model nothing would use."""
    if not spec.eval_every:
        raise SpecError(
            "eval_every",
            "must be more than 0 when steps_per_iteration is 0: such a run only evaluates its model (once, at step 0)",
        )
    if spec.iterations > 1:
        raise SpecError(
            "iterations",
            f"must be 1 when steps_per_iteration is 0 (evaluation only: nothing to iterate), got {spec.iterations}",
        )
    if spec.reward == "model":
        raise SpecError(
            "reward",
            "'model' trains a reward model for the training steps, but steps_per_iteration is 0 (evaluation only): "
            "use 'rule'",
        )


def _check_sharding(spec: RunSpec) -> None:
    """Refuse, naming the key, what a sharded run cannot do: bitsandbytes' 8-bit moments (its kernels read whole
    tensors, not a process's shard)."""
    if spec.optimizer == "adamw_8bit":
        raise SpecError(
            "optimizer",
            "'adamw_8bit' does not shard (bitsandbytes' kernels read whole tensors); with sharding 'fsdp' the fp32 "
            "moments are already split across the processes: use 'adamw'",
        )


def _check_lengths(spec: RunSpec) -> None:
    """Refuse, naming the key, an overlong buffer not below max_new_tokens, and a warm-up as long as the run."""
    if spec.overlong_penalty and spec.overlong_buffer >= spec.max_new_tokens:
        raise SpecError(
            "overlong_buffer",
            f"must be less than max_new_tokens {spec.max_new_tokens} (the penalty ramps down over the last "
            f"overlong_buffer tokens before it), got {spec.overlong_buffer}",
        )
    if spec.lr_warmup_steps and spec.lr_warmup_steps >= spec.total_steps:
        raise SpecError(
            "lr_warmup_steps",
            f"must be less than the run's {spec.total_steps:,} steps (iterations x steps_per_iteration), got "
            f"{spec.lr_warmup_steps:,}",
        )


def check_budget(spec: RunSpec, max_tokens_per_step: int) -> None:
    """Refuse (SpecError naming the keys) a run whose work exceeds a worker's budget of ``max_tokens_per_step``
    sampled tokens: a step samples batch_size x group_size x max_new_tokens tokens at most, and a reward model's
    (re)training rm_samples x 1.25 x max_new_tokens (its held-out quarter included), allowed RM_TOKEN_FACTOR
    steps' worth.

    >>> check_budget(RunSpec(batch_size=16, group_size=16, max_new_tokens=4096), 2**20)
    >>> try:
    ...     check_budget(RunSpec(batch_size=16, group_size=16, max_new_tokens=8192), 2**20)
    ... except SpecError as e:
    ...     print(e)
    batch_size x group_size x max_new_tokens: 16 x 16 x 8192 = 2,097,152 tokens a step, more than this dashboard's budget of 1,048,576 (GRPO_MAX_TOKENS_PER_STEP)
    """
    step_tokens = spec.batch_size * spec.group_size * spec.max_new_tokens
    if step_tokens > max_tokens_per_step:
        raise SpecError(
            "batch_size x group_size x max_new_tokens",
            f"{spec.batch_size} x {spec.group_size} x {spec.max_new_tokens} = {step_tokens:,} tokens a step, "
            f"more than this dashboard's budget of {max_tokens_per_step:,} (GRPO_MAX_TOKENS_PER_STEP)",
        )
    rm_tokens = int(spec.rm_samples * 1.25 * spec.max_new_tokens)
    if spec.reward == "model" and rm_tokens > RM_TOKEN_FACTOR * max_tokens_per_step:
        raise SpecError(
            "rm_samples",
            f"{spec.rm_samples} samples x 1.25 x max_new_tokens {spec.max_new_tokens} = "
            f"{rm_tokens:,} tokens a reward-model (re)training, more than {RM_TOKEN_FACTOR} "
            f"steps' budget ({RM_TOKEN_FACTOR * max_tokens_per_step:,} tokens, "
            "GRPO_MAX_TOKENS_PER_STEP)",
        )
