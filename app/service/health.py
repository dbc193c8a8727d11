"""Health rules: warnings that say why a run is (not) learning, read from its recorded metrics alone.

:func:`health_warnings` takes a run's per-step metrics (rows ``{"step", "iteration", <metric>: value}`` in
step order, as app.service.api.get_metrics returns them; a metric may be missing or None on any row), the
``(completion length in tokens, reward)`` pairs of the samples of its latest recorded steps, and its run spec,
and returns one warning dict per rule that fires::

    {"rule": "truncation", "title": "Outputs cut short", "message": "...", "steps": [31, 40],
     "metrics": ["truncated_frac"], "severity": "warning"}

``steps`` is the evidence window (first and last step), ``metrics`` the metrics that show it. The rules themselves
(their thresholds, ids, titles, when they fire, what to do; ``RULES`` for the docs and the UI, ``rules_markdown``
as a Markdown table) are app.service.health_rules'; this module holds their checks.

Windows: app.service.health_metrics (the recent window, the last max(5, 20%) training steps; the earlier one as
many before it). A rule needs MIN_STEPS (10) training steps, except the two that read the recent window alone
(zero_spread, truncation: MIN_STEPS_RECENT, 5) and the two that read evaluations (answer_form, the latest;
form_not_answers, >= 3 of them; step 0's, before training, included). A rule whose metric is absent from what it
reads does not fire (older runs lack ``repetition`` and ``groups/*``, a run with kl_coef 0 has no ``kl``).

Pure: no store, no torch, no Gradio.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Sequence

from app.service.health_metrics import (
    Row,
    eval_points,
    evaluations_between,
    fmt,
    latest_evaluation,
    mean_of,
    number,
    pearson,
    rises_between,
    span,
    training_rows,
    windows,
)
from app.service.health_rules import (
    ANSWER_FORM,
    CAUSE_CUT_LEVEL,
    CAUSE_STATED_LEVEL,
    ENTROPY_BASELINE_STEPS,
    ENTROPY_COLLAPSE,
    ENTROPY_FLOOR,
    ENTROPY_SHARE,
    FALL_DROP,
    FALL_EVAL_POINTS,
    FALL_SHARE,
    FORM_FLEXIBLE_LEVEL,
    FORM_FORMAT_LEVEL,
    FORM_GAP,
    FORM_METRICS,
    FORM_NOT_ANSWERS,
    FORM_RISE,
    HACK_EVAL_CEILING,
    HACK_EVAL_POINTS,
    HACK_EVAL_RISE,
    HACK_REWARD_RISE,
    KL_GROWTH,
    KL_GROWTH_FLOOR,
    KL_LIMIT,
    KL_RUNAWAY,
    LENGTH_PAIRS,
    LENGTH_R,
    LENGTH_REWARD,
    MATCH_WORDS,
    MIN_STEPS,
    MIN_STEPS_RECENT,
    REPETITION_LEVEL,
    REPETITION_RISE,
    REPETITION_RISING,
    REWARD_HACKING,
    TRUNCATION,
    TRUNCATION_LEVEL,
    ZERO_SPREAD,
    ZERO_SPREAD_LEVEL,
    Rule,
    either,
    entropy_remedies,
    form_metrics,
    form_not_answers_remedies,
    form_remedies,
    kl_remedies,
    length_remedies,
    repetition_remedies,
    spread_remedies,
    truncation_remedies,
)

HealthWarning = dict[str, Any]  # one warning: rule, title, message, steps, metrics, severity


def _warn(rule: Rule, message: str, steps: list[int], metrics: list[str]) -> HealthWarning:
    return {
        "rule": rule.id,
        "title": rule.title,
        "message": message,
        "steps": steps,
        "metrics": metrics,
        "severity": "warning",
    }


# --- the rules --------------------------------------------------------------------------------------------


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
        return _warn(
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
    return _warn(
        LENGTH_REWARD,
        f"longer outputs get higher rewards (r = {r:.2f} over {len(pairs)} samples). {either(length_remedies(config))}",
        span(windows(rows)[1]),
        ["completion_len", "reward_mean"],
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
    return _warn(
        REPETITION_RISING,
        f"outputs repeat themselves more: {now:.0%} of word 3-grams repeated in steps "
        f"{recent[0]['step']}-{recent[-1]['step']}, up from {before:.0%}. Look at the samples. "
        f"{either(repetition_remedies(config))}",
        span(earlier + recent),
        ["repetition"],
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
    return _warn(
        ENTROPY_COLLAPSE,
        f"entropy fell to {fmt(now)} nats in steps {recent[0]['step']}-{recent[-1]['step']}, from "
        f"{fmt(start)} in the first {len(first)} steps ({now / start:.0%} of it): the policy samples "
        f"almost one output and stops exploring. {either(entropy_remedies(config))}",
        [first[0]["step"], recent[-1]["step"]],
        ["entropy"],
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
    return _warn(
        KL_RUNAWAY,
        f"{found}: the policy is running away from the reference. {either(kl_remedies(config))}",
        span(earlier + recent),
        ["kl"],
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


def recent_at_least(metrics: Sequence[Row], name: str, level: float) -> tuple[list[Row], float] | None:
    """(the recent window, ``name``'s mean over it) when that mean is >= ``level`` after >= MIN_STEPS_RECENT
    training steps; None otherwise (too few steps, the metric not recorded, or below ``level``)."""
    rows = training_rows(metrics)
    if len(rows) < MIN_STEPS_RECENT:
        return None
    recent = windows(rows)[1]
    now = mean_of(recent, name)
    return None if now is None or now < level else (recent, now)


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
    return _warn(
        ZERO_SPREAD,
        f"{now:.0%} of groups had all rewards equal in steps {recent[0]['step']}-{recent[-1]['step']}: "
        f"their advantages are 0, so they teach nothing. {zero_spread_cause(recent, config)}",
        span(recent),
        shown,
    )


def check_truncation(metrics: Sequence[Row], length_reward: Sequence, config: Mapping) -> HealthWarning | None:
    """truncation: truncated_frac's recent-window mean is >= TRUNCATION_LEVEL (0.2), after >= MIN_STEPS_RECENT
    (5) training steps. The message gives max_new_tokens when the config has it, and names mask_truncated and
    overlong_penalty unless they are set already."""
    high = recent_at_least(metrics, "truncated_frac", TRUNCATION_LEVEL)
    if high is None:
        return None
    recent, now = high
    return _warn(
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
    return _warn(
        ANSWER_FORM,
        f"at step {step}'s evaluation {flexible:.0%} of held-out answers are right by their last number but "
        f"only {strict:.0%} as the reward reads them ('#### <answer>' or \\boxed{{}}, stated by "
        f"{formatted:.0%} of the outputs): the model's answers are right but not stated in the form the "
        f"reward reads, so they earn nothing. {either(form_remedies(config))}",
        [step, step],
        list(FORM_METRICS),
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
    rises = rises_between(metrics, ["eval/format"], form_metrics(config), best_step, last_step, FORM_RISE)
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
    return _warn(
        FORM_NOT_ANSWERS,
        f"held-out accuracy{f' under answer_match {match!r}' if meaning else ''} fell {fmt(best)} -> {fmt(last)} "
        f"(eval/accuracy{f': {meaning}' if meaning else ''}; {', '.join(fmt(v) for _, v in span_points)} at "
        f"steps {', '.join(str(s) for s, _ in span_points)}{beside}) while the form rose "
        f"({', '.join(f'{m} {fmt(a)} -> {fmt(b)}' for m, a, b in rises)}): the policy is learning to state an "
        f"answer, not to find it. {either(form_not_answers_remedies(config))}",
        [best_step, last_step],
        ["eval/accuracy"] + [m for m, _, _ in rises],
    )


Check = Callable[[Sequence[Row], Sequence, Mapping], "HealthWarning | None"]
# each rule's check, in RULES' order
CHECKS: tuple[tuple[Rule, Check], ...] = (
    (FORM_NOT_ANSWERS, check_form_not_answers),
    (ANSWER_FORM, check_answer_form),
    (REWARD_HACKING, check_reward_hacking),
    (LENGTH_REWARD, check_length_reward),
    (REPETITION_RISING, check_repetition_rising),
    (ENTROPY_COLLAPSE, check_entropy_collapse),
    (KL_RUNAWAY, check_kl_runaway),
    (ZERO_SPREAD, check_zero_spread),
    (TRUNCATION, check_truncation),
)


def health_warnings(
    metrics: Sequence[Row], length_reward: Iterable[tuple[float, float]] = (), config: Mapping | None = None
) -> list[HealthWarning]:
    """The warnings of every rule that fires on this run, in RULES' order (an empty list: nothing to say)."""
    rows, pairs, spec = list(metrics), list(length_reward), config or {}
    found = (check(rows, pairs, spec) for _, check in CHECKS)
    return [w for w in found if w is not None]
