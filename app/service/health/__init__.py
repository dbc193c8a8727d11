"""Health rules: warnings that say why a run is (not) learning, read from its recorded metrics alone.

:func:`health_warnings` takes a run's per-step metrics (rows ``{"step", "iteration", <metric>: value}`` in
step order, as app.service.api.get_metrics returns them; a metric may be missing or None on any row), the
``(completion length in tokens, reward)`` pairs of the samples of its latest recorded steps, and its run spec,
and returns one warning dict per rule that fires::

    {"rule": "truncation", "title": "Outputs cut short", "message": "...", "steps": [31, 40],
     "metrics": ["truncated_frac"], "severity": "warning"}

``steps`` is the evidence window (first and last step), ``metrics`` the metrics that show it. Each rule lives in one
module of this package, its thresholds, its words (id, title, when it fires, what to do), its check and its advice
for one run together: answers (form_not_answers, answer_form), rewards (reward_hacking, length_reward), policy
(entropy_collapse, kl_runaway), outputs (repetition_rising, zero_spread, truncation); advice holds what their words
share, metrics how they read metric rows. Here: ``RULES`` in the order the badge lists them, ``health_warnings``,
and ``rules_markdown``, the rules as docs/diagnosing.md's table.

Windows: app.service.health.metrics (the recent window, the last max(5, 20%) training steps; the earlier one as
many before it). A rule needs MIN_STEPS (10) training steps, except the two that read the recent window alone
(zero_spread, truncation: MIN_STEPS_RECENT, 5) and the two that read evaluations (answer_form, the latest;
form_not_answers, >= 3 of them; step 0's, before training, included). A rule whose metric is absent from what it
reads does not fire (older runs lack ``repetition`` and ``groups/*``, a run with kl_coef 0 has no ``kl``).

Pure: no store, no torch, no Gradio.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping, Sequence

from app.service.health.advice import HealthWarning, Rule
from app.service.health.answers import ANSWER_FORM, FORM_NOT_ANSWERS, check_answer_form, check_form_not_answers
from app.service.health.metrics import MIN_STEPS, MIN_STEPS_RECENT, Row, training_rows
from app.service.health.outputs import (
    REPETITION_RISING,
    TRUNCATION,
    ZERO_SPREAD,
    check_repetition_rising,
    check_truncation,
    check_zero_spread,
    zero_spread_cause,
)
from app.service.health.policy import ENTROPY_COLLAPSE, KL_RUNAWAY, check_entropy_collapse, check_kl_runaway
from app.service.health.rewards import LENGTH_REWARD, REWARD_HACKING, check_length_reward, check_reward_hacking

__all__ = [
    "MIN_STEPS",
    "MIN_STEPS_RECENT",
    "RULES",
    "health_warnings",
    "rules_markdown",
    "training_rows",
    "zero_spread_cause",
]

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


RULES: tuple[Rule, ...] = tuple(rule for rule, _ in CHECKS)  # every rule, in the order the badge lists them


def health_warnings(
    metrics: Sequence[Row], length_reward: Iterable[tuple[float, float]] = (), config: Mapping | None = None
) -> list[HealthWarning]:
    """The warnings of every rule that fires on this run, in RULES' order (an empty list: nothing to say)."""
    rows, pairs, spec = list(metrics), list(length_reward), config or {}
    found = (check(rows, pairs, spec) for _, check in CHECKS)
    return [w for w in found if w is not None]


def rules_markdown() -> str:
    """RULES as a Markdown table: rule | fires when | what to do."""
    lines = ["| rule | fires when | what to do |", "| --- | --- | --- |"]
    lines += [f"| `{r.id}` ({r.title}) | {r.condition} | {r.action} |" for r in RULES]
    return "\n".join(lines) + "\n"
