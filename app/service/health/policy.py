"""The rules on the policy itself. entropy_collapse: it samples almost one output. kl_runaway: it runs away from
the reference. Each with its thresholds, its words, its check and what to do. Pure.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from app.service.health.advice import (
    HealthWarning,
    Rule,
    either,
    now,
    warn,
)
from app.service.health.metrics import (
    MIN_STEPS,
    Row,
    fmt,
    mean_of,
    span,
    training_rows,
    windows,
)

# entropy_collapse
ENTROPY_BASELINE_STEPS = 5  # the first training steps whose mean entropy is the baseline
ENTROPY_SHARE = 0.2  # recent entropy below this share of the baseline ...
ENTROPY_FLOOR = 0.05  # ... or below this many nats (when it fell to there)


ENTROPY_COLLAPSE = Rule(
    "entropy_collapse",
    "Entropy collapsed",
    f"entropy's recent-window mean is < {ENTROPY_SHARE:.0%} of its mean over the first "
    f"{ENTROPY_BASELINE_STEPS} training steps, or < {ENTROPY_FLOOR} nats having started above that",
    "lower the learning rate, raise the temperature, or use clip-higher (clip_eps_high)",
)


def check_entropy_collapse(metrics: Sequence[Row], length_reward: Sequence, config: Mapping) -> HealthWarning | None:
    """entropy_collapse: entropy's recent-window mean is < ENTROPY_SHARE (20%) of its mean over the first
    ENTROPY_BASELINE_STEPS (5) training steps, or < ENTROPY_FLOOR (0.05) nats when that baseline was above
    it (a policy that starts that sure has not collapsed), after >= MIN_STEPS (10) training steps."""
    rows = training_rows(metrics)
    if len(rows) < MIN_STEPS:
        return None
    recent = windows(rows)[1]
    first = rows[:ENTROPY_BASELINE_STEPS]
    now, start = mean_of(recent, "entropy"), mean_of(first, "entropy")
    if now is None or start is None or start <= 0:
        return None
    if now >= ENTROPY_SHARE * start and not (now < ENTROPY_FLOOR < start):
        return None
    return warn(
        ENTROPY_COLLAPSE,
        f"entropy fell to {fmt(now)} nats in steps {recent[0]['step']}-{recent[-1]['step']}, from "
        f"{fmt(start)} in the first {len(first)} steps ({now / start:.0%} of it): the policy samples "
        f"almost one output and stops exploring. {either(entropy_remedies(config))}",
        [first[0]["step"], recent[-1]["step"]],
        ["entropy"],
    )


def entropy_remedies(config: Mapping) -> list[str]:
    """entropy_collapse's remedies: learning_rate, temperature, and clip-higher unless clip_eps_high is set."""
    high = config.get("clip_eps_high")
    return [
        f"lower learning_rate{now(config, 'learning_rate')}",
        f"raise the temperature{now(config, 'temperature')}",
        f"raise clip_eps_high{now(config, 'clip_eps_high')}" if high else "use clip-higher (clip_eps_high, e.g. 0.28)",
    ]


# kl_runaway
KL_LIMIT = 0.5  # nats per token: recent mean above this
KL_GROWTH = 4.0  # ... or above this many times the earlier window's mean ...
KL_GROWTH_FLOOR = 0.1  # ... while above this many nats per token


KL_RUNAWAY = Rule(
    "kl_runaway",
    "KL running away",
    f"in the current iteration (the reference resets at each), kl's recent-window mean is > {KL_LIMIT} "
    f"nats/token, or > {KL_GROWTH:g}x its earlier-window mean while > {KL_GROWTH_FLOOR} nats/token",
    "raise kl_coef or lower the learning rate",
)


def check_kl_runaway(metrics: Sequence[Row], length_reward: Sequence, config: Mapping) -> HealthWarning | None:
    """kl_runaway: over the current iteration's training steps (the reference is reset to the policy when an
    iteration starts, so kl restarts at 0), kl's recent-window mean is > KL_LIMIT (0.5) nats/token, or
    > KL_GROWTH (4) times its earlier-window mean while > KL_GROWTH_FLOOR (0.1); needs >= MIN_STEPS (10)
    training steps in the iteration."""
    rows = training_rows(metrics)
    if rows:
        rows = [r for r in rows if r.get("iteration") == rows[-1].get("iteration")]
    if len(rows) < MIN_STEPS:
        return None
    earlier, recent = windows(rows)
    now, before = mean_of(recent, "kl"), mean_of(earlier, "kl")
    where = f"steps {recent[0]['step']}-{recent[-1]['step']}"
    if now is not None and now > KL_LIMIT:
        found = f"kl averages {fmt(now)} nats/token in {where}, above {KL_LIMIT}"
    elif now is not None and before is not None and now > KL_GROWTH_FLOOR and now > KL_GROWTH * before:
        found = (
            f"kl grew {now / before:.1f}x, from {fmt(before)} to {fmt(now)} nats/token in {where}"
            if before > 0
            else f"kl rose from 0 to {fmt(now)} nats/token in {where}"
        )
    else:
        return None
    return warn(
        KL_RUNAWAY,
        f"{found}: the policy is running away from the reference. {either(kl_remedies(config))}",
        span(earlier + recent),
        ["kl"],
    )


def kl_remedies(config: Mapping) -> list[str]:
    """kl_runaway's remedies: kl_coef and learning_rate, with their values."""
    return [f"raise kl_coef{now(config, 'kl_coef')}", f"lower learning_rate{now(config, 'learning_rate')}"]
