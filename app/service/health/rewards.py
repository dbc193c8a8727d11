"""The rules on what the reward pays. reward_hacking: the reward rises while held-out accuracy stays flat.
length_reward: longer outputs are paid more. Each with its thresholds, its words, its check and what to do.
Pure.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from app.service.health.advice import (
    HealthWarning,
    Rule,
    either,
    named_rewards,
    warn,
)
from app.service.health.metrics import (
    MIN_STEPS,
    Row,
    evaluations_between,
    fmt,
    mean_of,
    number,
    pearson,
    span,
    training_rows,
    windows,
)

# reward_hacking
HACK_REWARD_RISE = 0.1  # reward_mean rise (recent window mean minus a baseline window mean), absolute
HACK_EVAL_RISE = 0.02  # eval/accuracy counts as flat when it changed by less than this over the same span
HACK_EVAL_POINTS = 3  # evaluations needed over the span
HACK_EVAL_CEILING = 0.95  # held-out accuracy this high at the span's start has no room left to rise


REWARD_HACKING = Rule(
    "reward_hacking",
    "Reward up, accuracy flat",
    f"reward_mean's recent-window mean is >= {HACK_REWARD_RISE} above its earlier-window mean (or, failing "
    f"that, the mean of as many first training steps) while eval/accuracy, over >= {HACK_EVAL_POINTS} evaluations from the last "
    f"one at or before that span to its end, changed by < {HACK_EVAL_RISE} (or fell); not when held-out "
    f"accuracy already was >= {HACK_EVAL_CEILING} at the span's start",
    "look at samples with a high reward that the verifier calls wrong; check the reward functions (or the "
    "learned reward model) for what they pay for besides a right answer",
)


def check_reward_hacking(metrics: Sequence[Row], length_reward: Sequence, config: Mapping) -> HealthWarning | None:
    """reward_hacking: reward_mean's recent-window mean is >= HACK_REWARD_RISE (0.1) above a baseline's mean
    while eval/accuracy stayed flat: over >= HACK_EVAL_POINTS (3) evaluations, from the last one at or before
    the baseline's first step to the recent window's last step, it moved by < HACK_EVAL_RISE (0.02) from the
    first of them to the last (or fell). The baselines, tried in turn: the earlier window, then the first as
    many training steps (a slow climb). After >= MIN_STEPS (10) training steps; not when held-out accuracy
    was >= HACK_EVAL_CEILING (0.95) at the baseline's start (it has no room left to rise)."""
    rows = training_rows(metrics)
    if len(rows) < MIN_STEPS:
        return None
    earlier, recent = windows(rows)
    now = mean_of(recent, "reward_mean")
    for base in (earlier, rows[: len(recent)]):
        before = mean_of(base, "reward_mean")
        if now is None or before is None or now - before < HACK_REWARD_RISE:
            continue
        points = evaluations_between(metrics, base[0]["step"], recent[-1]["step"])
        if len(points) < HACK_EVAL_POINTS or points[0][1] >= HACK_EVAL_CEILING:
            continue
        change = points[-1][1] - points[0][1]
        if change >= HACK_EVAL_RISE:
            continue
        rm = [v for r in metrics if (v := number(r.get("rm/accuracy_after"))) is not None]
        also = f" and the learned reward model (held-out accuracy {rm[-1]:.2f} at its last training)" if rm else ""
        return warn(
            REWARD_HACKING,
            f"reward_mean rose by {fmt(now - before)} ({fmt(before)} -> {fmt(now)}, steps "
            f"{base[0]['step']}-{base[-1]['step']} vs {recent[0]['step']}-{recent[-1]['step']}) while "
            f"eval/accuracy changed by {change:+.3f} ({points[0][1]:.3f} -> {points[-1][1]:.3f} over "
            f"{len(points)} evaluations): look at samples with a high reward that the verifier calls "
            f"wrong, and check what the reward functions{also} pay for.",
            [base[0]["step"], recent[-1]["step"]],
            ["reward_mean", "eval/accuracy"] + (["rm/accuracy_after"] if rm else []),
        )
    return None


# length_reward
LENGTH_R = 0.5  # Pearson r of (length, reward) at or above which longer outputs are paid more
LENGTH_PAIRS = 30  # samples needed


LENGTH_REWARD = Rule(
    "length_reward",
    "Longer outputs paid more",
    f"Pearson r of (completion length, reward) over the latest recorded samples is >= {LENGTH_R}, over "
    f">= {LENGTH_PAIRS} samples with some spread in both (a negative r is not flagged: short right answers "
    "beating long wrong or cut ones is normal)",
    "check that the reward does not pay for length (a length reward, a learned reward model)",
)


def check_length_reward(metrics: Sequence[Row], length_reward: Sequence, config: Mapping) -> HealthWarning | None:
    """length_reward: the Pearson r of the latest samples' (completion length, reward) pairs is >= LENGTH_R
    (0.5), over >= LENGTH_PAIRS (30) pairs with some spread in both, after >= MIN_STEPS (10) training steps.
    Only a positive r: short right answers beating long wrong (or cut) ones is normal. The window shown is
    the recent one, where the samples come from."""
    rows = training_rows(metrics)
    pairs = [(x, y) for x, y in ((number(a), number(b)) for a, b in length_reward) if x is not None and y is not None]
    if len(rows) < MIN_STEPS or len(pairs) < LENGTH_PAIRS:
        return None
    r = pearson(pairs)
    if r is None or r < LENGTH_R:
        return None
    return warn(
        LENGTH_REWARD,
        f"longer outputs get higher rewards (r = {r:.2f} over {len(pairs)} samples). {either(length_remedies(config))}",
        span(windows(rows)[1]),
        ["completion_len", "reward_mean"],
    )


def length_remedies(config: Mapping) -> list[str]:
    """length_reward's remedies: the named 'length' reward when the run has one, the learned reward model when
    it learns one, else what to look at."""
    rewards = named_rewards(config)
    remedies = [f"lower or drop the named reward length (weight {rewards['length']})"] if "length" in rewards else []
    if config.get("reward") == "model":
        remedies.append("check whether the learned reward model pays for length")
    return remedies or ["look at the longest and the shortest samples: what in the rewards pays for length"]
