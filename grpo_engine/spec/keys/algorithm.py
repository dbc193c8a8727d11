"""The run spec's "Algorithm" keys: the GRPO algorithm's numbers: G, B, M, I, mu, the clip, the KL weight, sampling, and
the loss's and advantages' variants.

One field a key (``key``: default, help, bounds, the Launch form's place and label, when a run reads it); RunSpec
(grpo_engine.spec.run_spec) gathers the four sections' keys in the form's order. Pure Python (no torch).
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_engine.spec.applicability import DYNAMIC_SAMPLING, OVERLONG
from grpo_engine.spec.keys.field import key
from grpo_engine.spec.words import ALGORITHM


@dataclass(frozen=True)
class AlgorithmKeys:
    """The Algorithm section's keys."""

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
        "M: GRPO steps per iteration (total steps = I x M). 0 evaluates the model once and trains nothing: its "
        "baseline on the held-out questions (eval_every > 0; eval_samples for Pass@K and Maj@K).",
        min=0,
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
        0,
        "Random seed for sampling, batching and initialisation. The same spec and seed record the same run in fp32 on "
        "the same machine, whether the model was built, converted or found cached, and whichever worker runs it.",
        min=0,
        max=2**31 - 1,
        section=ALGORITHM,
        fold=True,
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
