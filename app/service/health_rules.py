"""The health rules as the docs and the UI state them: each rule's thresholds, and its id, title, when it fires
and what to do (:class:`Rule`); :data:`RULES`, every rule in the order app.service.health checks them, and
:func:`rules_markdown`, that list as docs/diagnosing.md's Markdown table. The checks themselves, which read these
thresholds, are app.service.health's.

Pure Python, standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

# windows
MIN_STEPS = 10  # training steps recorded before a rule that compares windows may fire
MIN_STEPS_RECENT = 5  # ... before a rule that reads the recent window alone may fire

# reward_hacking
HACK_REWARD_RISE = 0.1  # reward_mean rise (recent window mean minus a baseline window mean), absolute
HACK_EVAL_RISE = 0.02  # eval/accuracy counts as flat when it changed by less than this over the same span
HACK_EVAL_POINTS = 3  # evaluations needed over the span
HACK_EVAL_CEILING = 0.95  # held-out accuracy this high at the span's start has no room left to rise

# length_reward
LENGTH_R = 0.5  # Pearson r of (length, reward) at or above which longer outputs are paid more
LENGTH_PAIRS = 30  # samples needed

# repetition_rising
REPETITION_LEVEL = 0.2  # recent mean share of repeated word 3-grams
REPETITION_RISE = 0.1  # its rise over the earlier window

# entropy_collapse
ENTROPY_BASELINE_STEPS = 5  # the first training steps whose mean entropy is the baseline
ENTROPY_SHARE = 0.2  # recent entropy below this share of the baseline ...
ENTROPY_FLOOR = 0.05  # ... or below this many nats (when it fell to there)

# kl_runaway
KL_LIMIT = 0.5  # nats per token: recent mean above this
KL_GROWTH = 4.0  # ... or above this many times the earlier window's mean ...
KL_GROWTH_FLOOR = 0.1  # ... while above this many nats per token

# zero_spread
ZERO_SPREAD_LEVEL = 0.8  # recent mean share of groups whose rewards are all equal

# truncation
TRUNCATION_LEVEL = 0.2  # recent mean share of completions cut at max_new_tokens

# answer_form: the latest evaluation's eval/accuracy_flexible, eval/accuracy_strict and eval/format
FORM_FLEXIBLE_LEVEL = 0.2  # a fifth of the held-out questions answered right (by the last number) or more ...
FORM_GAP = 0.15  # ... at least this much above the strict accuracy (right answers the reward does not see) ...
FORM_FORMAT_LEVEL = 0.5  # ... while fewer than this share of the outputs state a final answer in the strict form
FORM_METRICS = ("eval/accuracy_strict", "eval/accuracy_flexible", "eval/format")
CAUSE_CUT_LEVEL = 0.5  # zero spread's cause: at least this share of the outputs cut at max_new_tokens, or ...
CAUSE_STATED_LEVEL = 0.2  # ... mostly all wrong with fewer than this share stating an answer in the strict form


@dataclass(frozen=True)
class Rule:
    """One health rule as the docs and UI list it: its id, a short title, when it fires, what to do."""

    id: str
    title: str
    condition: str
    action: str


ANSWER_FORM = Rule(
    "answer_form",
    "Right answers, wrong form",
    f"at the latest evaluation (step 0's included), eval/accuracy_flexible is >= {FORM_FLEXIBLE_LEVEL} and "
    f">= {FORM_GAP} above eval/accuracy_strict while eval/format is < {FORM_FORMAT_LEVEL}; not with answer_match "
    "'flexible'",
    "set answer_match: flexible; or ask for the form with question_template (e.g. '{question}\\nLet's think step "
    'by step and output the final answer after "####".\'); or pay for it with format_reward',
)
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
LENGTH_REWARD = Rule(
    "length_reward",
    "Longer outputs paid more",
    f"Pearson r of (completion length, reward) over the latest recorded samples is >= {LENGTH_R}, over "
    f">= {LENGTH_PAIRS} samples with some spread in both (a negative r is not flagged: short right answers "
    "beating long wrong or cut ones is normal)",
    "check that the reward does not pay for length (a length reward, a learned reward model)",
)
REPETITION_RISING = Rule(
    "repetition_rising",
    "Outputs repeat themselves",
    f"repetition's recent-window mean is >= {REPETITION_LEVEL} and >= {REPETITION_RISE} above its earlier-window mean",
    "look at the samples; add a repetition reward, lower the learning rate or raise kl_coef",
)
ENTROPY_COLLAPSE = Rule(
    "entropy_collapse",
    "Entropy collapsed",
    f"entropy's recent-window mean is < {ENTROPY_SHARE:.0%} of its mean over the first "
    f"{ENTROPY_BASELINE_STEPS} training steps, or < {ENTROPY_FLOOR} nats having started above that",
    "lower the learning rate, raise the temperature, or use clip-higher (clip_eps_high)",
)
KL_RUNAWAY = Rule(
    "kl_runaway",
    "KL running away",
    f"in the current iteration (the reference resets at each), kl's recent-window mean is > {KL_LIMIT} "
    f"nats/token, or > {KL_GROWTH:g}x its earlier-window mean while > {KL_GROWTH_FLOOR} nats/token",
    "raise kl_coef or lower the learning rate",
)
ZERO_SPREAD = Rule(
    "zero_spread",
    "Most groups teach nothing",
    f"zero_std_frac's recent-window mean is >= {ZERO_SPREAD_LEVEL} (from {MIN_STEPS_RECENT} training steps on)",
    "the message names the cause: outputs cut (raise max_new_tokens), no answer in the reward's form (answer_match, "
    "question_template, format_reward), mostly all wrong (easier questions, group_size, temperature) or all right "
    "(harder questions, skip_zero_spread)",
)
TRUNCATION = Rule(
    "truncation",
    "Outputs cut short",
    f"truncated_frac's recent-window mean is >= {TRUNCATION_LEVEL} (from {MIN_STEPS_RECENT} training steps on)",
    "raise max_new_tokens, or set mask_truncated or overlong_penalty",
)

# every rule, in the order health_warnings checks them
RULES: tuple[Rule, ...] = (
    ANSWER_FORM,
    REWARD_HACKING,
    LENGTH_REWARD,
    REPETITION_RISING,
    ENTROPY_COLLAPSE,
    KL_RUNAWAY,
    ZERO_SPREAD,
    TRUNCATION,
)


def rules_markdown() -> str:
    """RULES as a Markdown table: rule | fires when | what to do."""
    lines = ["| rule | fires when | what to do |", "| --- | --- | --- |"]
    lines += [f"| `{r.id}` ({r.title}) | {r.condition} | {r.action} |" for r in RULES]
    return "\n".join(lines) + "\n"
