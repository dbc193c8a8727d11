"""app/service/health/ (one module per family of rules, each rule's thresholds, words and check together): each health rule on metric histories built here, where it fires and
where it does not."""

from __future__ import annotations

import math

import pytest

from app.service import health
from app.service.health import RULES, health_warnings, rules_markdown
from app.service.health.metrics import pearson, span, window_size, windows

WARNING_KEYS = {"rule", "title", "message", "steps", "metrics", "severity"}


def run(n: int, evals: dict[int, float] | None = None, iterations: int = 1, **series) -> list[dict]:
    """Metric rows of steps 0..n: step 0 holds only eval/accuracy (when ``evals`` has it), steps 1..n hold
    every series, each a constant, a list of n values (None = not recorded), or a function of the step."""
    evals = evals or {}
    rows = [{"step": 0, "iteration": 0, "eval/accuracy": evals[0]}] if 0 in evals else []
    per_iteration = -(-n // iterations)
    for step in range(1, n + 1):
        row = {"step": step, "iteration": (step - 1) // per_iteration}
        for name, values in series.items():
            value = values(step) if callable(values) else values[step - 1] if isinstance(values, list) else values
            if value is not None:
                row[name] = value
        if step in evals:
            row["eval/accuracy"] = evals[step]
        rows.append(row)
    return rows


def ramp(start: float, end: float, n: int):
    """A series going linearly from ``start`` at step 1 to ``end`` at step n."""
    return lambda step: start + (end - start) * (step - 1) / max(n - 1, 1)


def fired(metrics, length_reward=(), config=None) -> list[str]:
    return [w["rule"] for w in health_warnings(metrics, length_reward, config)]


def only(rule: str, metrics, length_reward=(), config=None) -> dict:
    """The one warning of ``rule``, checked for its shape."""
    warnings = [w for w in health_warnings(metrics, length_reward, config) if w["rule"] == rule]
    assert len(warnings) == 1, warnings
    w = warnings[0]
    assert set(w) == WARNING_KEYS and w["severity"] == "warning" and w["title"]
    assert w["steps"][0] <= w["steps"][1]
    return w


def healthy(n: int = 200) -> list[dict]:
    """A run of the built-in task that learns, shaped like a default run's metrics (200 steps): held-out
    accuracy 0.37 -> 0.96, noisy rewards, entropy around 0.02-0.04 nats, kl spiking to 0.15, up to 3/4 of the
    groups zero-spread once most answers are right, nothing truncated or repeated."""
    wobble = [0.0, 0.08, -0.05, 0.03, -0.08]  # step-to-step noise, by step % 5
    evals = {s: round(0.96 - 0.6 * math.exp(-s / 25), 3) for s in range(0, n + 1, 10)}
    return run(
        n,
        evals,
        reward_mean=lambda s: min(0.95 - 0.3 * math.exp(-s / 40) + wobble[s % 5], 1.0),
        reward_std=0.3,
        correct_frac=lambda s: min(0.95 - 0.3 * math.exp(-s / 40) + wobble[s % 5], 1.0),
        zero_std_frac=lambda s: 0.3 + 0.4 * (1 - math.exp(-s / 60)) + wobble[s % 5],
        kl=lambda s: min(0.005 * s, 0.05) + (0.1 if s % 17 == 0 else 0.0),
        loss=0.001,
        clip_frac=0.0,
        entropy=lambda s: 0.02 + 0.015 * math.exp(-s / 60) + wobble[s % 5] / 20,
        completion_len=19.5,
        truncated_frac=lambda s: 0.01 if s % 30 == 0 else 0.0,
        grad_norm=0.7,
        learning_rate=2e-4,
        repetition=0.0,
        **{"groups/all_right": 5, "groups/all_wrong": 0, "groups/mixed": 3},
    )


# --- the whole --------------------------------------------------------------------------------------------


def test_a_healthy_run_fires_nothing_at_any_step():
    pairs = [(19 + i % 3, 0.0 if i % 3 == 2 and i % 2 else 1.0) for i in range(320)]  # the longest: less often right
    assert pearson(pairs) < 0
    metrics, config = healthy(), {"max_new_tokens": 32, "kl_coef": 0.04, "skip_zero_spread": False}
    assert health_warnings(metrics, pairs, config) == []
    for last in range(1, len(metrics)):  # as the run goes
        assert health_warnings(metrics[:last], (), config) == [], last


def test_empty_and_short_histories_fire_nothing():
    assert health_warnings([]) == []
    assert health_warnings([{"step": 0, "iteration": 0, "eval/accuracy": 0.5}]) == []
    assert fired(run(4, zero_std_frac=1.0, truncated_frac=1.0)) == []


def test_missing_and_none_metrics_fire_nothing():
    assert health_warnings(run(40)) == []
    assert health_warnings(run(40, reward_mean=None, kl=None, entropy=None, repetition=None)) == []


def test_rules_markdown_lists_every_rule():
    table = rules_markdown()
    assert table.splitlines()[0] == "| rule | fires when | what to do |"
    assert len(table.splitlines()) == 2 + len(RULES)
    for rule in RULES:
        assert f"`{rule.id}`" in table
    assert [r.id for r in RULES] == [
        "form_not_answers",
        "answer_form",
        "reward_hacking",
        "length_reward",
        "repetition_rising",
        "entropy_collapse",
        "kl_runaway",
        "zero_spread",
        "truncation",
    ]
    assert [rule for rule, _ in health.CHECKS] == list(RULES)


def test_windows():
    assert [window_size(n) for n in (5, 10, 25, 26, 100)] == [5, 5, 5, 6, 20]
    earlier, recent = windows(run(30))
    assert span(earlier) == [19, 24] and span(recent) == [25, 30]
    earlier, recent = windows(run(7))
    assert span(earlier) == [1, 2] and span(recent) == [3, 7]


# --- reward_hacking ---------------------------------------------------------------------------------------


def hacked(n: int = 50, reward_end: float = 0.62, eval_end: float = 0.51) -> list[dict]:
    """Reward 0.5, then ``reward_end`` over the last fifth of the n steps; accuracy flat, then ``eval_end``."""
    evals = {s: 0.5 for s in range(0, n, 10)} | {n: eval_end}
    return run(n, evals, reward_mean=lambda s: reward_end if s > n - window_size(n) else 0.5)


def test_reward_hacking_fires_when_reward_rises_and_accuracy_stays():
    w = only("reward_hacking", hacked())
    assert w["steps"] == [31, 50]  # the earlier window (31-40) to the recent one (41-50)
    assert w["metrics"] == ["reward_mean", "eval/accuracy"]
    assert "rose by 0.12 (0.50 -> 0.62, steps 31-40 vs 41-50)" in w["message"]
    assert "+0.010 (0.500 -> 0.510 over 3 evaluations)" in w["message"]  # those of steps 30, 40, 50


def test_reward_hacking_fires_when_accuracy_falls():
    assert "-0.100" in only("reward_hacking", hacked(eval_end=0.4))["message"]


def test_reward_hacking_names_a_learned_reward_model():
    metrics = hacked()
    metrics[20]["rm/accuracy_after"] = 0.71
    w = only("reward_hacking", metrics)
    assert "learned reward model (held-out accuracy 0.71" in w["message"]
    assert w["metrics"] == ["reward_mean", "eval/accuracy", "rm/accuracy_after"]


def test_reward_hacking_skips_steps_without_reward():
    metrics = hacked()
    for row in metrics[1::2]:
        row["reward_mean"] = None
    assert "rose by 0.12" in only("reward_hacking", metrics)["message"]


def test_reward_hacking_falls_back_to_the_first_window_on_a_slow_climb():
    n = 100
    evals = {s: 0.5 for s in range(0, n + 1, 10)}
    w = only("reward_hacking", run(n, evals, reward_mean=ramp(0.5, 0.65, n)))  # 0.03 per window, 0.12 in all
    assert w["steps"] == [1, 100] and "rose by 0.12" in w["message"] and "11 evaluations" in w["message"]


@pytest.mark.parametrize(
    "metrics",
    [
        hacked(eval_end=0.53),  # accuracy rose 0.03
        hacked(reward_end=0.599),  # reward rose 0.099
        hacked(n=9, reward_end=2.0),  # too few steps
        run(50, {0: 0.5, 50: 0.5}, reward_mean=ramp(0.5, 0.8, 50)),  # 2 evaluations only
        run(50, reward_mean=ramp(0.5, 0.8, 50)),  # no evaluation
        run(50, {s: 0.96 for s in range(0, 51, 10)}, reward_mean=ramp(0.5, 0.8, 50)),  # accuracy at the ceiling
    ],
    ids=["accuracy-rose", "just-under", "too-few-steps", "two-evals", "no-evals", "ceiling"],
)
def test_reward_hacking_does_not_fire(metrics):
    assert "reward_hacking" not in fired(metrics)


# --- length_reward ----------------------------------------------------------------------------------------


def correlated(n: int, noise: float) -> list[tuple[int, float]]:
    """n (length, reward) pairs: reward = length / 100, plus an alternating +-noise."""
    return [(10 + i, (10 + i) / 100 + (noise if i % 2 else -noise)) for i in range(n)]


def test_length_reward_fires_on_a_positive_correlation():
    pairs = correlated(240, 0.3)
    r = pearson(pairs)
    w = only("length_reward", run(40), pairs)
    assert f"r = {r:.2f} over 240 samples" in w["message"] and "longer outputs get higher rewards" in w["message"]
    assert w["steps"] == [33, 40] and w["metrics"] == ["completion_len", "reward_mean"]


def test_length_reward_threshold():
    just_over = correlated(100, 0.51)  # r = 0.504
    just_under = correlated(100, 0.52)  # r = 0.497
    assert pearson(just_over) >= 0.5 > pearson(just_under)
    assert "length_reward" in fired(run(20), just_over)
    assert "length_reward" not in fired(run(20), just_under)


@pytest.mark.parametrize(
    "metrics, pairs",
    [
        (run(20), [(10 + i, -i / 10) for i in range(100)]),  # strong negative: not flagged
        (run(20), correlated(29, 0.0)),  # 29 pairs
        (run(20), [(20, float(i % 2)) for i in range(100)]),  # every length equal
        (run(20), [(10 + i, 1.0) for i in range(100)]),  # every reward equal
        (run(9), correlated(100, 0.0)),  # too few steps
        (run(20), []),
    ],
    ids=["negative", "29-pairs", "no-length-spread", "no-reward-spread", "too-few-steps", "no-pairs"],
)
def test_length_reward_does_not_fire(metrics, pairs):
    assert "length_reward" not in fired(metrics, pairs)


# --- repetition_rising ------------------------------------------------------------------------------------


def repeating(recent: float, earlier: float = 0.05, n: int = 20) -> list[dict]:
    return run(n, repetition=lambda s: recent if s > n - window_size(n) else earlier)


def test_repetition_rising_fires():
    w = only("repetition_rising", repeating(0.3))
    assert w["steps"] == [11, 20] and w["metrics"] == ["repetition"]
    assert "30%" in w["message"] and "up from 5%" in w["message"]


@pytest.mark.parametrize(
    "metrics",
    [
        repeating(0.19),  # recent just under 0.2
        repeating(0.3, earlier=0.21),  # rose only 0.09
        repeating(0.5, n=9),  # too few steps
        run(20),  # an older run: no repetition metric
        run(20, repetition=[None] * 15 + [0.5] * 5),  # nothing in the earlier window
    ],
    ids=["just-under", "small-rise", "too-few-steps", "missing", "no-earlier"],
)
def test_repetition_rising_does_not_fire(metrics):
    assert "repetition_rising" not in fired(metrics)


# --- entropy_collapse -------------------------------------------------------------------------------------


def test_entropy_collapse_fires_below_a_fifth_of_the_start():
    w = only("entropy_collapse", run(40, entropy=ramp(1.0, 0.1, 40)))
    assert w["steps"] == [1, 40] and w["metrics"] == ["entropy"]
    assert "fell to 0.18 nats in steps 33-40, from 0.95 in the first 5 steps (19% of it)" in w["message"]
    assert "clip_eps_high" in w["message"]


def test_entropy_collapse_fires_below_the_floor():
    w = only("entropy_collapse", run(20, entropy=lambda s: 0.2 if s <= 5 else 0.04))
    assert "fell to 0.04 nats" in w["message"] and "20%" in w["message"]


@pytest.mark.parametrize(
    "metrics",
    [
        run(40, entropy=lambda s: 1.0 if s <= 5 else 0.21),  # 21% of the start
        run(20, entropy=0.03),  # started below the floor: nothing fell
        run(9, entropy=lambda s: 1.0 if s <= 5 else 0.01),  # too few steps
        run(20, entropy=None),  # missing
    ],
    ids=["just-over-share", "started-low", "too-few-steps", "missing"],
)
def test_entropy_collapse_does_not_fire(metrics):
    assert "entropy_collapse" not in fired(metrics)


# --- kl_runaway -------------------------------------------------------------------------------------------


def test_kl_runaway_fires_above_the_limit():
    w = only("kl_runaway", run(20, kl=lambda s: 0.4 if s <= 15 else 0.6), config={"kl_coef": 0.04})
    assert w["steps"] == [11, 20] and w["metrics"] == ["kl"]
    assert "kl averages 0.60 nats/token in steps 16-20" in w["message"] and "(now 0.04)" in w["message"]


def test_kl_runaway_fires_on_fast_growth():
    w = only("kl_runaway", run(20, kl=lambda s: 0.03 if s <= 15 else 0.15))
    assert "kl grew 5.0x, from 0.03 to 0.15 nats/token in steps 16-20" in w["message"]
    assert "(now" not in w["message"]  # kl_coef unknown


def test_kl_runaway_reads_the_current_iteration_only():
    kl = [0.6] * 20 + [0.01] * 20  # the first iteration ran away, the second restarted from its reference
    assert "kl_runaway" not in fired(run(40, iterations=2, kl=kl))
    assert "kl_runaway" in fired(run(40, iterations=2, kl=kl[::-1]))


@pytest.mark.parametrize(
    "metrics",
    [
        run(40, kl=lambda s: 0.01 * s / 4),  # steady growth from 0 to 0.1: 1.3x per window
        run(20, kl=lambda s: 0.01 if s <= 15 else 0.09),  # 9x, but under 0.1
        run(20, kl=lambda s: 0.05 if s <= 15 else 0.19),  # 3.8x
        run(9, kl=1.0),  # too few steps
        run(20, kl=None),  # kl_coef 0: no kl
    ],
    ids=["steady", "small", "slower-than-4x", "too-few-steps", "missing"],
)
def test_kl_runaway_does_not_fire(metrics):
    assert "kl_runaway" not in fired(metrics)


# --- zero_spread ------------------------------------------------------------------------------------------


def test_zero_spread_fires_from_five_steps():
    w = only("zero_spread", run(5, zero_std_frac=0.9))
    assert w["steps"] == [1, 5] and w["metrics"] == ["zero_std_frac"]
    assert "90% of groups" in w["message"] and "skip_zero_spread" in w["message"]


def test_zero_spread_says_too_easy_or_too_hard():
    easy = only("zero_spread", run(20, zero_std_frac=0.85, **{"groups/all_right": 6, "groups/all_wrong": 1}))
    assert "too easy" in easy["message"] and "30 groups" in easy["message"]
    assert easy["metrics"] == ["zero_std_frac", "groups/all_right", "groups/all_wrong"]
    hard = only("zero_spread", run(20, zero_std_frac=0.85, **{"groups/all_right": 0, "groups/all_wrong": 7}))
    assert "too hard" in hard["message"]


def test_zero_spread_names_cut_outputs_and_answers_in_the_wrong_form():
    """The cause read from the evidence, with the key to change: most outputs cut first; then all-wrong groups
    whose outputs state no answer in the reward's form (a real instruct model answering in prose)."""
    wrong = {"groups/all_right": 0, "groups/all_wrong": 4}
    cut = only(
        "zero_spread",
        run(20, zero_std_frac=1.0, truncated_frac=0.75, answer_stated_frac=0.0, **wrong),
        config={"max_new_tokens": 96},
    )
    assert "75% of the outputs were cut at max_new_tokens (now 96)" in cut["message"]
    assert "Raise max_new_tokens." in cut["message"] and "truncated_frac" in cut["metrics"]
    form = only("zero_spread", run(20, zero_std_frac=1.0, truncated_frac=0.1, answer_stated_frac=0.05, **wrong))
    assert "only 5% of the outputs state a final answer" in form["message"]
    assert "answer_match: flexible" in form["message"] and "question_template" in form["message"]
    assert "too hard" not in form["message"] and "answer_stated_frac" in form["metrics"]
    stated = only("zero_spread", run(20, zero_std_frac=1.0, truncated_frac=0.1, answer_stated_frac=0.9, **wrong))
    assert "too hard" in stated["message"]


def test_zero_spread_does_not_suggest_dynamic_sampling_when_it_is_on():
    w = only("zero_spread", run(20, zero_std_frac=0.85), config={"skip_zero_spread": True})
    assert "skip_zero_spread" not in w["message"] and "group_size" in w["message"]


@pytest.mark.parametrize(
    "metrics",
    [
        run(20, zero_std_frac=0.79),
        run(4, zero_std_frac=1.0),
        run(20),
        run(20, zero_std_frac=lambda s: 1.0 if s <= 15 else 0.5),  # it was, not any more
    ],
    ids=["just-under", "too-few-steps", "missing", "earlier-only"],
)
def test_zero_spread_does_not_fire(metrics):
    assert "zero_spread" not in fired(metrics)


# --- truncation -------------------------------------------------------------------------------------------


def test_truncation_fires_and_names_max_new_tokens():
    w = only("truncation", run(30, truncated_frac=lambda s: 0.35 if s > 24 else 0.0), config={"max_new_tokens": 64})
    assert w["steps"] == [25, 30] and w["metrics"] == ["truncated_frac", "completion_len"]
    assert "35% of completions" in w["message"] and "Raise max_new_tokens (now 64)" in w["message"]
    assert "mask_truncated or overlong_penalty" in w["message"]


def test_truncation_says_what_a_cut_output_lacks_under_the_runs_answer_match():
    """Under answer_match flexible a cut output's last number is still read as its answer, and may be right: the
    warning does not say cut outputs end without one."""
    strict = only("truncation", run(5, truncated_frac=0.5))
    assert "they end without a final answer." in strict["message"]
    flexible = only("truncation", run(5, truncated_frac=0.5), config={"answer_match": "flexible"})
    assert "without a final answer" not in flexible["message"]
    assert "answer_match flexible still reads their last number, right or wrong" in flexible["message"]


def test_truncation_leaves_out_what_is_set():
    w = only("truncation", run(5, truncated_frac=0.2), config={"mask_truncated": True})
    assert "(now" not in w["message"] and "or set overlong_penalty" in w["message"]
    assert "mask_truncated" not in w["message"]


@pytest.mark.parametrize(
    "metrics",
    [
        run(30, truncated_frac=0.19),
        run(4, truncated_frac=1.0),
        run(30),
    ],
    ids=["just-under", "too-few-steps", "missing"],
)
def test_truncation_does_not_fire(metrics):
    assert "truncation" not in fired(metrics)


# --- answer_form ------------------------------------------------------------------------------------------

STRICT = {
    "answer_match": "strict",
    "format_reward": 0.0,
    "rewards": [],
    "question_template": "",
    "supervision": "outcome",
}


def evaluation(step: int, strict: float, flexible: float, formatted: float, match: str = "strict") -> dict:
    """One evaluation's row as the trainer records it: eval/accuracy is the run's rule's."""
    return {
        "step": step,
        "iteration": 0 if step == 0 else 1,
        "eval/accuracy": flexible if match == "flexible" else strict,
        "eval/accuracy_strict": strict,
        "eval/accuracy_flexible": flexible,
        "eval/format": formatted,
    }


def test_answer_form_fires_at_step_0_for_an_instruct_model_answering_in_prose():
    w = only("answer_form", [evaluation(0, 0.0, 0.35, 0.02)], config=STRICT)
    assert w["steps"] == [0, 0] and w["metrics"] == ["eval/accuracy_strict", "eval/accuracy_flexible", "eval/format"]
    assert "35% of held-out answers are right by their last number but only 0%" in w["message"]
    assert "stated by 2% of the outputs" in w["message"]
    assert "the model's answers are right but not stated in the form the reward reads" in w["message"]
    for key in ("answer_match: flexible", "question_template", 'output the final answer after "####"', "format_reward"):
        assert key in w["message"], key


def test_answer_form_reads_the_latest_evaluation():
    metrics = run(20, {0: 0.0, 10: 0.0, 20: 0.3}, reward_mean=0.0)
    metrics[0].update(evaluation(0, 0.0, 0.3, 0.0))
    metrics[10].update(evaluation(10, 0.0, 0.3, 0.1))
    assert only("answer_form", metrics, config=STRICT)["steps"] == [10, 10]
    metrics[20].update(evaluation(20, 0.3, 0.35, 0.9))  # learned the form: the latest evaluation is healthy
    assert "answer_form" not in fired(metrics, config=STRICT)


def test_answer_form_leaves_out_what_the_config_has():
    template = {**STRICT, "question_template": "{question}\nShow your working."}
    w = only("answer_form", [evaluation(0, 0.0, 0.4, 0.0)], config=template)
    assert "reword question_template" in w["message"] and "Let's think" not in w["message"]
    asked = only("answer_form", [evaluation(0, 0.0, 0.4, 0.0)], config={**STRICT, "question_template": "{q} ####"})
    assert "question_template" not in asked["message"]
    paid = only("answer_form", [evaluation(0, 0.0, 0.4, 0.0)], config={**STRICT, "format_reward": 0.1})
    assert "format_reward" not in paid["message"]
    named = only("answer_form", [evaluation(0, 0.0, 0.4, 0.0)], config={**STRICT, "rewards": [{"name": "accuracy"}]})
    assert '{"name": "format_after_working", "weight": 0.05} to rewards' in named["message"]
    process = only("answer_form", [evaluation(0, 0.0, 0.4, 0.0)], config={**STRICT, "supervision": "process"})
    assert "format_reward" not in process["message"] and '"name": "format"' not in process["message"]


@pytest.mark.parametrize(
    "metrics, config",
    [
        ([evaluation(0, 0.0, 0.19, 0.0)], STRICT),  # flexible just under 0.2
        ([evaluation(0, 0.06, 0.2, 0.0)], STRICT),  # a gap of 0.14
        ([evaluation(0, 0.0, 0.4, 0.5)], STRICT),  # half the outputs state the strict form
        ([evaluation(0, 0.3, 0.3, 0.9)], STRICT),  # a model that states its answers
        (
            [evaluation(0, 0.0, 0.35, 0.02, "flexible")],
            {**STRICT, "answer_match": "flexible"},
        ),  # the reward counts them
        ([{"step": 0, "iteration": 0, "eval/accuracy": 0.0}], STRICT),  # an older run: no strict / flexible numbers
        ([], STRICT),
    ],
    ids=["flexible-low", "small-gap", "format-half", "stated", "flexible-rule", "older-run", "nothing"],
)
def test_answer_form_does_not_fire(metrics, config):
    assert "answer_form" not in fired(metrics, config=config)


def test_answer_form_thresholds_are_inclusive():
    assert "answer_form" in fired([evaluation(0, 0.05, 0.2, 0.49)], config=STRICT)  # 0.2, a gap of 0.15, < 0.5
