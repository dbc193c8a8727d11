"""The rules on what the outputs look like. repetition_rising: they repeat themselves more. zero_spread: most
groups have all rewards equal (with :func:`zero_spread_cause`, why). truncation: they are cut at max_new_tokens.
Each with its thresholds, its words, its check and what to do. Pure.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from app.service.health.advice import (
    HealthWarning,
    Rule,
    either,
    named_builtins,
    named_rewards,
    now,
    warn,
)
from app.service.health.answers import form_remedies
from app.service.health.metrics import (
    MIN_STEPS,
    MIN_STEPS_RECENT,
    Row,
    mean_of,
    number,
    recent_at_least,
    span,
    training_rows,
    windows,
)

# repetition_rising
REPETITION_LEVEL = 0.2  # recent mean share of repeated word 3-grams
REPETITION_RISE = 0.1  # its rise over the earlier window


REPETITION_RISING = Rule(
    "repetition_rising",
    "Outputs repeat themselves",
    f"repetition's recent-window mean is >= {REPETITION_LEVEL} and >= {REPETITION_RISE} above its earlier-window mean",
    "look at the samples; add a repetition reward, lower the learning rate or raise kl_coef",
)


def check_repetition_rising(metrics: Sequence[Row], length_reward: Sequence, config: Mapping) -> HealthWarning | None:
    """repetition_rising: repetition's recent-window mean is >= REPETITION_LEVEL (0.2) and >= REPETITION_RISE
    (0.1) above its earlier-window mean, after >= MIN_STEPS (10) training steps."""
    rows = training_rows(metrics)
    if len(rows) < MIN_STEPS:
        return None
    earlier, recent = windows(rows)
    now, before = mean_of(recent, "repetition"), mean_of(earlier, "repetition")
    if now is None or before is None or now < REPETITION_LEVEL or now - before < REPETITION_RISE:
        return None
    return warn(
        REPETITION_RISING,
        f"outputs repeat themselves more: {now:.0%} of word 3-grams repeated in steps "
        f"{recent[0]['step']}-{recent[-1]['step']}, up from {before:.0%}. Look at the samples. "
        f"{either(repetition_remedies(config))}",
        span(earlier + recent),
        ["repetition"],
    )


def repetition_remedies(config: Mapping) -> list[str]:
    """repetition_rising's remedies: a repetition named reward (its weight raised where the run has one; not
    with a learned reward model or process supervision, which take no built-in), the learning rate, kl_coef."""
    rewards = named_rewards(config)
    remedies = []
    if "repetition" in rewards:
        remedies.append(f"raise the repetition reward's weight (now {rewards['repetition']})")
    elif named_builtins(config):
        remedies.append('add {"name": "repetition", "weight": 1.0} to rewards')
    return remedies + [
        f"lower learning_rate{now(config, 'learning_rate')}",
        f"raise kl_coef{now(config, 'kl_coef')}",
    ]


# zero_spread
ZERO_SPREAD_LEVEL = 0.8  # recent mean share of groups whose rewards are all equal
CAUSE_CUT_LEVEL = 0.5  # zero spread's cause: at least this share of the outputs cut at max_new_tokens, or ...
CAUSE_STATED_LEVEL = 0.2  # ... mostly all wrong with fewer than this share stating an answer in the strict form


ZERO_SPREAD = Rule(
    "zero_spread",
    "Most groups teach nothing",
    f"zero_std_frac's recent-window mean is >= {ZERO_SPREAD_LEVEL} (from {MIN_STEPS_RECENT} training steps on)",
    "the message names the cause: outputs cut (raise max_new_tokens), no answer in the reward's form (answer_match, "
    "question_template, format_reward), mostly all wrong (easier questions, group_size, temperature) or all right "
    "(harder questions, skip_zero_spread)",
)


def check_zero_spread(metrics: Sequence[Row], length_reward: Sequence, config: Mapping) -> HealthWarning | None:
    """zero_spread: zero_std_frac's recent-window mean is >= ZERO_SPREAD_LEVEL (0.8), after
    >= MIN_STEPS_RECENT (5) training steps. The message names the cause and the key to change
    (zero_spread_cause)."""
    high = recent_at_least(metrics, "zero_std_frac", ZERO_SPREAD_LEVEL)
    if high is None:
        return None
    recent, now = high
    shown = ["zero_std_frac"] + [
        m
        for m in ("groups/all_right", "groups/all_wrong", "truncated_frac", "answer_stated_frac")
        if mean_of(recent, m) is not None
    ]
    return warn(
        ZERO_SPREAD,
        f"{now:.0%} of groups had all rewards equal in steps {recent[0]['step']}-{recent[-1]['step']}: "
        f"their advantages are 0, so they teach nothing. {zero_spread_cause(recent, config)}",
        span(recent),
        shown,
    )


def zero_spread_cause(rows: Sequence[Row], config: Mapping) -> str:
    """Why groups had all rewards equal over ``rows`` (metrics rows: a window, or one step's), read from the
    evidence, with the keys to change that the config does not have already: most outputs cut at max_new_tokens
    (truncated_frac >= CAUSE_CUT_LEVEL); all-wrong groups whose outputs state no answer in the form the reward
    reads (answer_stated_frac < CAUSE_STATED_LEVEL, with answer_match not 'flexible', whose reward reads an
    output's last number: the reward cannot see an answer, however right); else mostly all wrong (too hard) or
    all right (too easy), from groups/all_right and groups/all_wrong; else a general sentence. One or two
    sentences, starting with a capital, ending with a period.

    >>> zero_spread_cause([{"truncated_frac": 0.75, "groups/all_wrong": 4}], {"max_new_tokens": 96})
    '75% of the outputs were cut at max_new_tokens (now 96), so they state no answer. Raise max_new_tokens.'
    """
    cut, stated = mean_of(rows, "truncated_frac"), mean_of(rows, "answer_stated_frac")
    right = sum(v for r in rows if (v := number(r.get("groups/all_right"))) is not None)
    wrong = sum(v for r in rows if (v := number(r.get("groups/all_wrong"))) is not None)
    if cut is not None and cut >= CAUSE_CUT_LEVEL:
        limit = config.get("max_new_tokens")
        return (
            f"{cut:.0%} of the outputs were cut at max_new_tokens{f' (now {limit})' if limit else ''}, so they "
            "state no answer. Raise max_new_tokens."
        )
    remedies = form_remedies(config) if config.get("answer_match") != "flexible" else []
    if wrong > right and stated is not None and stated < CAUSE_STATED_LEVEL and remedies:
        return (
            f"Most are all wrong, and only {stated:.0%} of the outputs state a final answer in the form the "
            f"reward reads ('#### <answer>' or \\boxed{{}}). {either(remedies)}"
        )
    if wrong > right:
        return (
            f"Most are all wrong ({wrong:.0f} groups vs {right:.0f} all right): the questions are too hard. "
            f"{either(spread_remedies(config, 'hard'))}"
        )
    if right > wrong:
        return (
            f"Most are all right ({right:.0f} groups vs {wrong:.0f} all wrong): the questions are too easy. "
            f"{either(spread_remedies(config, 'easy'))}"
        )
    return either(spread_remedies(config, "far"))


def spread_remedies(config: Mapping, too: str) -> list[str]:
    """zero_spread's remedies when most groups are all wrong (``too`` 'hard'), all right ('easy') or neither
    ('far'): the questions, group_size and the temperature (not for questions too easy), and skip_zero_spread
    unless it is on.

    >>> spread_remedies({"skip_zero_spread": True}, "easy")
    ['use harder questions']
    """
    questions = {"hard": "use easier questions", "easy": "use harder questions"}
    remedies = [questions.get(too, "use questions nearer the model's level")]
    if too != "easy":
        remedies += [
            f"raise group_size{now(config, 'group_size')}",
            f"raise the temperature{now(config, 'temperature')}",
        ]
    return remedies + ([] if config.get("skip_zero_spread") else ["turn on skip_zero_spread"])


# truncation
TRUNCATION_LEVEL = 0.2  # recent mean share of completions cut at max_new_tokens


TRUNCATION = Rule(
    "truncation",
    "Outputs cut short",
    f"truncated_frac's recent-window mean is >= {TRUNCATION_LEVEL} (from {MIN_STEPS_RECENT} training steps on)",
    "raise max_new_tokens, or set mask_truncated or overlong_penalty",
)


def check_truncation(metrics: Sequence[Row], length_reward: Sequence, config: Mapping) -> HealthWarning | None:
    """truncation: truncated_frac's recent-window mean is >= TRUNCATION_LEVEL (0.2), after >= MIN_STEPS_RECENT
    (5) training steps. The message gives max_new_tokens when the config has it, and names mask_truncated and
    overlong_penalty unless they are set already."""
    high = recent_at_least(metrics, "truncated_frac", TRUNCATION_LEVEL)
    if high is None:
        return None
    recent, now = high
    return warn(
        TRUNCATION,
        f"{now:.0%} of completions were cut at max_new_tokens in steps {recent[0]['step']}-"
        f"{recent[-1]['step']}: {cut_outputs(config)} {either(truncation_remedies(config))}",
        span(recent),
        ["truncated_frac", "completion_len"],
    )


def cut_outputs(config: Mapping) -> str:
    """What a cut output lacks, as the run's answer_match reads it: with ``flexible`` a number in the cut text is
    still read as its answer (and may be right), so "without an answer" would be wrong there.

    >>> cut_outputs({"answer_match": "flexible"})
    'they stop before stating a final answer (answer_match flexible still reads their last number, right or wrong).'
    """
    if config.get("answer_match") == "flexible":
        return "they stop before stating a final answer (answer_match flexible still reads their last number, right or wrong)."
    return "they end without a final answer."


def truncation_remedies(config: Mapping) -> list[str]:
    """truncation's remedies: max_new_tokens, and mask_truncated and overlong_penalty unless already set."""
    unset = [k for k in ("mask_truncated", "overlong_penalty") if not config.get(k)]
    return [f"raise max_new_tokens{now(config, 'max_new_tokens')}"] + (["set " + " or ".join(unset)] if unset else [])
