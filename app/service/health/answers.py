"""The rules on answers and their form. form_not_answers: held-out accuracy falls while the form rises (the policy
learns to state an answer, not to find it). answer_form: right answers that are not stated in the form the
reward reads. Each with its thresholds, its words (:class:`~app.service.health.advice.Rule`), its check and
what to do for one run. Pure.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from app.service.health.advice import (
    ANSWER_RECIPE,
    FORM_AFTER_WORKING,
    GSM8K_TEMPLATE,
    MATCH_WORDS,
    HealthWarning,
    Rule,
    asks_for_form,
    either,
    form_metrics,
    form_rewards,
    named_builtins,
    named_rewards,
    now,
    reads,
    rewards_json,
    warn,
)
from app.service.health.metrics import (
    Row,
    eval_points,
    fmt,
    latest_evaluation,
    rises_between,
)

# form_not_answers: held-out accuracy falls over the evaluations while the form rises
FALL_EVAL_POINTS = 3  # evaluations needed, step 0's included: two make one change, three a direction
FALL_DROP = 0.1  # the latest eval/accuracy at least this far below the best one before it (2 of 20 held-out
#                  questions: more than one question's wobble) ...
FALL_SHARE = 1 / 3  # ... and at least this share of that best (0.90 -> 0.80 is a wobble; 0.25 -> 0.15 lost 40%)
FORM_RISE = 0.1  # the form rose by at least this: eval/format from that best evaluation to the latest, or the
#                  share a reward that pays the form pays (first training window since then vs the recent window)


FORM_NOT_ANSWERS = Rule(
    "form_not_answers",
    "Learning the form, not the answers",
    f"over >= {FALL_EVAL_POINTS} evaluations (step 0's included), the latest eval/accuracy (held-out accuracy under "
    f"the run's answer_match) is >= {FALL_DROP} and >= {FALL_SHARE:.0%} below the best one before it, while "
    f"eval/format rose by >= {FORM_RISE} since that evaluation or a reward that pays the form rose by >= "
    f"{FORM_RISE} over the training steps since (answer_stated_frac with format_reward > 0, reward/format, "
    "reward/format_after_working)",
    "lower or drop format_reward or the format named reward (they pay a bare '#### 7'); use the named rewards "
    "strict_correct and format_after_working; lower learning_rate",
)


def check_form_not_answers(metrics: Sequence[Row], length_reward: Sequence, config: Mapping) -> HealthWarning | None:
    """form_not_answers: over >= FALL_EVAL_POINTS (3) evaluations, the latest eval/accuracy (under the run's
    answer_match) is >= FALL_DROP (0.1) and >= FALL_SHARE (a third) below the best one before it, while the form
    rose by >= FORM_RISE (0.1) since: eval/format, or what pays the form over the training steps in between
    (form_metrics). The policy learns to state an answer, not to find it (a bare '#### 7' collects the form's
    pay). The message names the numbers, which accuracy fell (the other rule's beside it) and what to change
    that the config does not have already (form_not_answers_remedies)."""
    points = eval_points(metrics)
    if len(points) < FALL_EVAL_POINTS:
        return None
    last_step, last = points[-1]
    best_step, best = max(points[:-1], key=lambda p: p[1])  # the first of equal bests
    fall = round(best - last, 9)
    if fall < FALL_DROP or fall < round(FALL_SHARE * best, 9):
        return None
    rises = rises_between(
        metrics, ["eval/format"], form_metrics(config), first=best_step, last=last_step, level=FORM_RISE
    )
    if not rises:
        return None
    span_points = [(s, v) for s, v in points if best_step <= s]
    match = config.get("answer_match")
    meaning, other = MATCH_WORDS.get(match, ("", ""))
    others = dict(eval_points(metrics, other))
    beside = (
        f"; {other} {fmt(others[best_step])} -> {fmt(others[last_step])}"
        if {best_step, last_step} <= others.keys()
        else ""
    )
    return warn(
        FORM_NOT_ANSWERS,
        f"held-out accuracy{f' under answer_match {match!r}' if meaning else ''} fell {fmt(best)} -> {fmt(last)} "
        f"(eval/accuracy{f': {meaning}' if meaning else ''}; {', '.join(fmt(v) for _, v in span_points)} at "
        f"steps {', '.join(str(s) for s, _ in span_points)}{beside}) while the form rose "
        f"({', '.join(f'{m} {fmt(a)} -> {fmt(b)}' for m, a, b in rises)}): the policy is learning to state an "
        f"answer, not to find it. {either(form_not_answers_remedies(config))}",
        [best_step, last_step],
        ["eval/accuracy"] + [m for m, _, _ in rises],
    )


def form_not_answers_remedies(config: Mapping) -> list[str]:
    """What to change when held-out accuracy falls while the form rises (form_not_answers): lower or drop what
    pays a bare form (format_reward, the 'format' named reward; format_after_working's weight), use the named
    rewards strict_correct and format_after_working where the run has not, lower learning_rate.

    >>> form_not_answers_remedies({"format_reward": 0.1, "learning_rate": 1e-05})[0]
    'lower or drop format_reward (now 0.1)'
    """
    rewards = named_rewards(config)
    remedies = [
        f"lower or drop format_reward{now(config, 'format_reward')}"
        if name == "format_reward"
        else f"lower or drop the named reward {name} (weight {rewards[name]})"
        if name != FORM_AFTER_WORKING["name"]
        else f"lower the named reward {name}'s weight (now {rewards[name]})"
        for name in form_rewards(config)
    ]
    wanted = [r for r in (*ANSWER_RECIPE[1:], FORM_AFTER_WORKING) if r["name"] not in rewards]
    if wanted and named_builtins(config):
        remedies.append(
            "pay the answer and not only the form with the named rewards strict_correct (a right answer stated "
            "as '#### <answer>') and format_after_working (the form after 5 or more words of working): "
            + (
                f"rewards {rewards_json([*ANSWER_RECIPE, FORM_AFTER_WORKING])}"
                if not rewards
                else f"add {rewards_json(wanted)[1:-1]} to rewards"
                + (" in place of format" if "format" in rewards else "")
            )
        )
    if config.get("reward") == "model":
        remedies.append("check what the learned reward model pays for besides a right answer")
    remedies.append(f"lower learning_rate{now(config, 'learning_rate')}")
    return remedies


# answer_form: the latest evaluation's eval/accuracy_flexible, eval/accuracy_strict and eval/format
FORM_FLEXIBLE_LEVEL = 0.2  # a fifth of the held-out questions answered right (by the last number) or more ...
FORM_GAP = 0.15  # ... at least this much above the strict accuracy (right answers the reward does not see) ...
FORM_FORMAT_LEVEL = 0.5  # ... while fewer than this share of the outputs state a final answer in the strict form
FORM_METRICS = ("eval/accuracy_strict", "eval/accuracy_flexible", "eval/format")


ANSWER_FORM = Rule(
    "answer_form",
    "Right answers, wrong form",
    f"at the latest evaluation (step 0's included), eval/accuracy_flexible is >= {FORM_FLEXIBLE_LEVEL} and "
    f">= {FORM_GAP} above eval/accuracy_strict while eval/format is < {FORM_FORMAT_LEVEL}; not with answer_match "
    "'flexible'",
    "set answer_match: flexible; or ask for the form with question_template (e.g. '{question}\\nLet's think step "
    'by step and output the final answer after "####".\'); or pay for it after some working with the named reward '
    "format_after_working (format_reward pays a bare '#### 7' too)",
)


def check_answer_form(metrics: Sequence[Row], length_reward: Sequence, config: Mapping) -> HealthWarning | None:
    """answer_form: at the latest evaluation (latest_evaluation; step 0's counts, so the warning comes before
    training wastes steps on rewards of 0), eval/accuracy_flexible is >= FORM_FLEXIBLE_LEVEL (0.2) and
    >= FORM_GAP (0.15) above eval/accuracy_strict, while eval/format is < FORM_FORMAT_LEVEL (0.5): the model
    answers right in prose, which the strict verifier reads as no answer. Not with answer_match 'flexible' (the
    reward counts those answers already)."""
    latest = latest_evaluation(metrics, FORM_METRICS)
    if latest is None or config.get("answer_match") == "flexible":
        return None
    step, (strict, flexible, formatted) = latest
    if flexible < FORM_FLEXIBLE_LEVEL or round(flexible - strict, 9) < FORM_GAP or formatted >= FORM_FORMAT_LEVEL:
        return None
    return warn(
        ANSWER_FORM,
        f"at step {step}'s evaluation {flexible:.0%} of held-out answers are right by their last number but "
        f"only {strict:.0%} as the reward reads them ('#### <answer>' or \\boxed{{}}, stated by "
        f"{formatted:.0%} of the outputs): the model's answers are right but not stated in the form the "
        f"reward reads, so they earn nothing. {either(form_remedies(config))}",
        [step, step],
        list(FORM_METRICS),
    )


def form_remedies(config: Mapping) -> list[str]:
    """What to change when right answers are not stated in the form the reward reads (answer_form, zero_spread's
    form cause), leaving out what the config already has: answer_match 'flexible', a prompt that asks for '####',
    a reward that pays the form.

    >>> form_remedies({"answer_match": "flexible", "question_template": "{question} ####", "format_reward": 0.1})
    []
    """
    remedies = []
    if config.get("answer_match") != "flexible":
        remedies.append("set answer_match: flexible (the reward then also counts an output's last number)")
    if not asks_for_form(config):
        remedies.append(
            "reword question_template to ask for a last line '#### <answer>'"
            if config.get("question_template")
            else f"ask for the form with question_template, e.g. '{GSM8K_TEMPLATE}'"
        )
    if not form_rewards(config) and config.get("supervision") != "process":
        if not named_rewards(config) and reads(config, "format_reward"):
            remedies.append(
                "pay for the form after some working with the named reward format_after_working (rewards "
                f"{rewards_json([*ANSWER_RECIPE, FORM_AFTER_WORKING])}; format_reward pays a bare '#### 7' too)"
                if named_builtins(config)
                else "pay for the form with format_reward (e.g. 0.1)"
            )
        elif named_builtins(config):
            remedies.append(f"add {rewards_json([FORM_AFTER_WORKING])[1:-1]} to rewards")
    return remedies
