"""The health rule form_not_answers ("Learning the form, not the answers") on the run that showed it, and every
health message and the Groups tab's zero-spread banner read against a run spec that already has what they could
advise (app/service/health/)."""

from __future__ import annotations

import json

import pytest

from app import store
from app.service import api
from app.service.health import health_warnings, zero_spread_cause
from app.service.health.advice import ANSWER_RECIPE, FORM_AFTER_WORKING
from app.service.health.answers import form_not_answers_remedies
from app.store.db import session_scope
from app.web.views.group import zero_spread_banner
from app.web.views.run import health_html
from grpo_engine.rewards.builtin_rewards import BUILTINS
from grpo_engine.spec.config import validate_spec
from tests.support.store import new_run

# the new user's run: SmolLM2-135M-Instruct on 200 easy word problems
NEW_USER = {
    "model": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "dataset": "/data/word_problems_200.jsonl",
    "question_template": '{question}\nLet\'s think step by step and output the final answer after "####".',
    "system_prompt": "Solve the word problem. End with a last line '#### <number>'.",
    "answer_match": "flexible",
    "format_reward": 0.1,
    "learning_rate": 1e-5,
    "group_size": 8,
    "batch_size": 4,
    "max_new_tokens": 160,
    "iterations": 1,
    "steps_per_iteration": 15,
    "eval_every": 5,
}
CONFIG = validate_spec(NEW_USER).to_dict()  # as the run is stored: every key
# its held-out evaluations: step -> (flexible, strict, format)
EVALS = {0: (0.25, 0.05, 0.50), 5: (0.25, 0.00, 0.60), 10: (0.15, 0.05, 0.70), 15: (0.05, 0.05, 1.00)}


def rows(evals: dict[int, tuple[float, float, float]] = EVALS, match: str = "flexible", n: int = 15, **extra) -> list:
    """Metric rows of steps 0..n as the trainer records them: step 0 the evaluation alone, training steps with
    reward 0.17 -> 0.30, truncation halving 0.60 -> 0.30 and the outputs stating a '####' answer 0.40 -> 0.85
    (what format_reward pays), and each evaluation's four numbers (eval/accuracy: the run's answer_match rule's).
    ``extra``: more training series, each a function of the step."""
    out = []
    for step in range(n + 1):
        row: dict = {"step": step, "iteration": 0 if step == 0 else 1}
        if step:
            t = (step - 1) / (n - 1)
            row |= {
                "reward_mean": 0.17 + 0.13 * t,
                "truncated_frac": 0.60 - 0.30 * t,
                "answer_stated_frac": 0.40 + 0.45 * t,
                "zero_std_frac": 0.4,
                "completion_len": 150 - 60 * t,
            }
            row |= {name: series(step) for name, series in extra.items()}
        if step in evals:
            flexible, strict, formatted = evals[step]
            row |= {
                "eval/accuracy": flexible if match == "flexible" else strict,
                "eval/accuracy_flexible": flexible,
                "eval/accuracy_strict": strict,
                "eval/format": formatted,
            }
        out.append(row)
    return out


def rules(metrics, config) -> list[str]:
    return [w["rule"] for w in health_warnings(metrics, (), config)]


# --- the new user's run ---------------------------------------------------------------------------------------


def test_the_new_users_run_is_flagged_by_step_15_and_leads_the_badge():
    metrics = rows()
    assert "form_not_answers" not in rules(metrics[:10], CONFIG)  # steps 0-9: the evaluations at 0 and 5 only
    assert rules(metrics[:11], CONFIG)[0] == "form_not_answers"  # 0.25 -> 0.15 at step 10, the form 0.50 -> 0.70
    warnings = health_warnings(metrics, (), CONFIG)
    assert [w["rule"] for w in warnings] == ["form_not_answers", "truncation"]
    w = warnings[0]
    assert w["title"] == "Learning the form, not the answers" and w["steps"] == [0, 15]
    assert w["metrics"] == ["eval/accuracy", "eval/format", "answer_stated_frac"]
    message = w["message"]
    for words in (
        "held-out accuracy under answer_match 'flexible' fell 0.25 -> 0.05",  # which accuracy: the run's rule
        "0.25, 0.25, 0.15, 0.05 at steps 0, 5, 10, 15",
        "eval/accuracy_strict 0.05 -> 0.05",  # the other rule's, beside it
        "eval/format 0.50 -> 1.00",
        "answer_stated_frac 0.46 -> 0.79",  # what format_reward pays: steps 1-5 against 11-15
        "Lower or drop format_reward (now 0.1)",
        "strict_correct",
        "format_after_working",
        "lower learning_rate (now 1e-05)",
    ):
        assert words in message, (words, message)
    # the badge's headline is the first warning's title
    badge = health_html(warnings, 15)
    assert "⚠ 2 health warnings: Learning the form, not the answers, Outputs cut short</summary>" in badge
    assert badge.index('data-rule="form_not_answers"') < badge.index('data-rule="truncation"')


def test_the_new_users_run_through_get_run(db_url, monkeypatch):
    """The stored run and its stored metrics, on SQLite and PostgreSQL: /get_run's warnings lead with the rule."""
    monkeypatch.setenv("GRPO_DATABASE_URL", db_url)
    run_id = new_run(db_url, **NEW_USER)
    with session_scope(db_url) as s:
        for row in rows():
            values = {k: v for k, v in row.items() if k not in ("step", "iteration")}
            store.record_step(s, run_id, row["step"], row["iteration"], values)
    warnings = api.get_run(run_id)["warnings"]
    assert [w["rule"] for w in warnings] == ["form_not_answers", "truncation"]
    assert "format_reward (now 0.1)" in warnings[0]["message"] and "now 1e-05" in warnings[0]["message"]


def test_a_strict_run_says_its_accuracy_is_the_strict_one():
    evals = {0: (0.30, 0.30, 0.40), 5: (0.25, 0.25, 0.60), 10: (0.10, 0.10, 0.90)}
    config = {**CONFIG, "answer_match": "strict"}
    [w] = [w for w in health_warnings(rows(evals, "strict", n=10), (), config) if w["rule"] == "form_not_answers"]
    assert "under answer_match 'strict' fell 0.30 -> 0.10" in w["message"]
    assert "only '#### <answer>' or \\boxed{} counts" in w["message"]
    assert "eval/accuracy_flexible 0.30 -> 0.10" in w["message"]


def test_a_named_form_reward_rising_is_the_form_rising():
    """eval/format flat at 1.0 (the model states '####' from the start), the format_after_working share rising."""
    evals = {s: (f, f, 1.0) for s, f in ((0, 0.4), (5, 0.35), (10, 0.2))}
    config = validate_spec(
        {**NEW_USER, "format_reward": 0.0, "rewards": [*ANSWER_RECIPE, FORM_AFTER_WORKING]}
    ).to_dict()
    metrics = rows(evals, n=10, **{"reward/format_after_working": lambda s: 0.2 + 0.06 * s})
    [w] = [w for w in health_warnings(metrics, (), config) if w["rule"] == "form_not_answers"]
    assert w["metrics"] == ["eval/accuracy", "reward/format_after_working"]
    assert "Lower the named reward format_after_working's weight (now 0.05)" in w["message"]
    assert "format_reward" not in w["message"] and "add" not in w["message"]  # it has the named rewards already
    assert "form_not_answers" not in rules(metrics, {**config, "rewards": ANSWER_RECIPE})  # nothing pays the form


@pytest.mark.parametrize(
    "metrics",
    [
        rows({0: (0.25, 0.05, 0.5), 5: (0.35, 0.1, 0.6), 10: (0.45, 0.3, 0.7), 15: (0.6, 0.5, 1.0)}),  # both rise
        rows({0: (0.25, 0.05, 0.5), 15: (0.05, 0.05, 1.0)}),  # two evaluations only
        rows({0: (0.5, 0.4, 0.5), 5: (0.5, 0.4, 0.6), 10: (0.42, 0.4, 0.9)}, n=10),  # fell 0.08
        rows({0: (0.9, 0.9, 0.5), 5: (0.85, 0.85, 0.6), 10: (0.75, 0.75, 0.9)}, n=10),  # fell 0.15, a sixth of it
        rows({s: (f, 0.05, 0.5) for s, f in ((0, 0.25), (5, 0.2), (10, 0.1))}, n=10, answer_stated_frac=lambda s: 0.5),
    ],
    ids=["accuracy-rises-with-the-form", "two-evaluations", "small-fall", "small-share", "form-flat"],
)
def test_form_not_answers_does_not_fire(metrics):
    assert "form_not_answers" not in rules(metrics, CONFIG)


def test_the_suggested_rewards_are_built_in_and_launch():
    """The named rewards the message suggests exist, and its recipe is a run spec launch accepts."""
    assert {r["name"] for r in (*ANSWER_RECIPE, FORM_AFTER_WORKING)} <= set(BUILTINS)
    [suggested] = [r for r in form_not_answers_remedies(CONFIG) if "rewards [" in r]
    recipe = json.loads(suggested[suggested.index("[") :])
    assert validate_spec({**NEW_USER, "format_reward": 0.0, "rewards": recipe}).rewards == recipe


# --- every advice reads the run's own settings ----------------------------------------------------------------

PROSE = [{"step": 0, "iteration": 0, "eval/accuracy": 0.0, "eval/accuracy_strict": 0.0}]
PROSE[0] |= {"eval/accuracy_flexible": 0.4, "eval/format": 0.0}
STRICT = {**CONFIG, "answer_match": "strict", "question_template": "", "system_prompt": "", "format_reward": 0.0}
ZERO = {"zero_std_frac": 1.0, "truncated_frac": 0.1, "answer_stated_frac": 0.05}
WRONG, RIGHT = {"groups/all_wrong": 4, "groups/all_right": 0}, {"groups/all_wrong": 0, "groups/all_right": 4}


def series(n: int, **values) -> list[dict]:
    """Steps 1..n, each value a constant or a function of the step."""
    return [
        {"step": s, "iteration": 1, **{k: v(s) if callable(v) else v for k, v in values.items()}}
        for s in range(1, n + 1)
    ]


REWARDS = [{"name": "accuracy", "weight": 1.0}]
# (rule, metrics that fire it, a spec without the setting, the same spec with it, the advice that must go)
ADVICE = [
    ("answer_form", PROSE, STRICT, {"question_template": "{question}\nEnd with '#### <answer>'."}, "question_template"),
    ("answer_form", PROSE, STRICT, {"system_prompt": "Put the answer in \\boxed{}."}, "question_template"),
    ("answer_form", PROSE, STRICT, {"format_reward": 0.1}, "format_after_working"),
    ("answer_form", PROSE, {**STRICT, "rewards": REWARDS}, {"rewards": [*REWARDS, FORM_AFTER_WORKING]}, "add"),
    ("zero_spread", series(10, **ZERO, **WRONG), STRICT, {"answer_match": "flexible"}, "answer_match"),
    ("zero_spread", series(10, **ZERO, **WRONG), STRICT, {"question_template": "{question} ####"}, "question_template"),
    ("zero_spread", series(10, **ZERO, **WRONG), STRICT, {"format_reward": 0.2}, "format_after_working"),
    ("zero_spread", series(10, **ZERO, **WRONG), {**STRICT, "answer_match": "flexible"}, {"skip_zero_spread": True}, "skip_zero_spread"),
    ("zero_spread", series(10, **ZERO, **RIGHT), STRICT, {"skip_zero_spread": True}, "skip_zero_spread"),
    ("zero_spread", series(10, zero_std_frac=1.0), STRICT, {"skip_zero_spread": True}, "skip_zero_spread"),
    ("truncation", series(10, truncated_frac=0.5), STRICT, {"mask_truncated": True}, "mask_truncated"),
    ("truncation", series(10, truncated_frac=0.5), STRICT, {"overlong_penalty": 0.5}, "overlong_penalty"),
    ("repetition_rising", series(20, repetition=lambda s: 0.4 if s > 15 else 0.0), {**STRICT, "rewards": REWARDS},
     {"rewards": [*REWARDS, {"name": "repetition", "weight": 1.0}]}, '{"name": "repetition"'),
    ("entropy_collapse", series(20, entropy=lambda s: 1.0 if s <= 5 else 0.01), STRICT, {"clip_eps_high": 0.28}, "use clip-higher"),
    ("form_not_answers", rows(), {**CONFIG, "format_reward": 0.0, "rewards": [{"name": "format", "weight": 0.1}]},
     {"rewards": [*ANSWER_RECIPE, FORM_AFTER_WORKING, {"name": "format", "weight": 0.1}]}, "strict_correct (a right"),
    ("form_not_answers", rows(), {**CONFIG, "format_reward": 0.0, "rewards": [{"name": "format", "weight": 0.1}]},
     {"rewards": [*ANSWER_RECIPE, FORM_AFTER_WORKING]}, "drop the named reward format"),
    ("form_not_answers", rows(), CONFIG, {"format_reward": 0.0, "rewards": [{"name": "format_after_working", "weight": 0.1}]}, "format_reward"),
]  # fmt: skip


@pytest.mark.parametrize("rule, metrics, without, setting, advice", ADVICE, ids=[f"{a[0]}-{a[4]}" for a in ADVICE])
def test_no_advice_to_set_what_the_spec_already_has(rule, metrics, without, setting, advice):
    def message(config):
        return next(w["message"] for w in health_warnings(metrics, (), config) if w["rule"] == rule)

    assert advice in message(without)
    assert advice not in message({**without, **setting})


def test_the_groups_banner_reads_the_runs_settings():
    """The zero-spread banner at a step of the new user's run (all wrong, few outputs in the strict form): its
    answer_match is 'flexible' and its template asks for '####', so neither is advised; a strict run without
    the template is told both."""
    step = {"step": 12, "zero_std_frac": 1.0, "truncated_frac": 0.2, "answer_stated_frac": 0.1, **WRONG}
    groups = [{"reward_std": 0.0}] * 4
    banner = zero_spread_banner(groups, zero_spread_cause([step], CONFIG))
    assert "answer_match" not in banner and "question_template" not in banner
    assert "too hard" in banner and "(now 8)" in banner and "skip_zero_spread" in banner
    strict = zero_spread_banner(groups, zero_spread_cause([step], STRICT))
    assert "Set answer_match: flexible" in strict and "ask for the form with question_template" in strict


def test_an_older_run_without_the_other_rules_accuracy_is_still_read():
    """Step 0 recorded eval/accuracy and eval/format alone: the rule fires without the other rule's numbers."""
    metrics = rows()
    for key in ("eval/accuracy_strict", "eval/accuracy_flexible"):
        del metrics[0][key]
    [w] = [w for w in health_warnings(metrics, (), CONFIG) if w["rule"] == "form_not_answers"]
    assert "fell 0.25 -> 0.05" in w["message"] and "eval/accuracy_strict" not in w["message"]
