"""Named rewards (grpo_engine.rewards.reward_functions): each built-in on hand-computed numbers, the weighted sum, the
``rewards`` key's refusals (each naming ``rewards``), the reward/<name> metrics and where the charts draw them, and
the group view's words for named rewards."""

from __future__ import annotations

import math

import pytest

from app.web.views.charts import chart_panels
from app.web.views.reading import components_html
from grpo_engine.report.metrics import METRICS
from grpo_engine.rewards.builtin_rewards import (
    BUILTINS,
    accuracy_reward,
    format_after_working_reward,
    format_reward,
    length_reward,
    repetition_reward,
    strict_correct_reward,
)
from grpo_engine.rewards.reward_functions import named_rewards, reward_means, score_outputs
from grpo_engine.spec.config import SpecError, validate_spec
from grpo_engine.spec.presets import PRESETS, WORD_PROBLEMS_CPU


def test_accuracy_is_the_verifier():
    assert accuracy_reward("2+3*4", "3*4=12\n2+12=14\n#### 14", "14") == 1.0
    assert accuracy_reward("q", "so \\boxed{\\frac{1}{2}}", "0.5") == 1.0  # math-verify
    assert accuracy_reward("q", "#### 15", "#### 14") == 0.0
    assert accuracy_reward("q", "#### 15", "14", correct=1.0) == 1.0  # the engine's verdict when given


def test_format_rewards_a_stated_final_answer_right_or_wrong():
    assert format_reward("q", "blah\n#### 99", "14") == 1.0
    assert format_reward("q", "the answer is 14", "14") == 0.0


@pytest.mark.parametrize(
    "completion, strict_correct, after_working",
    [
        ("Tom has 3 + 5 = 8 apples.\n#### 8", 1.0, 1.0),  # right, stated after 7 words
        ("Tom has 3 + 5 = 9 apples.\n#### 9", 0.0, 1.0),  # wrong, stated after working: the form is paid
        ("#### 8", 1.0, 0.0),  # right, bare: no working
        ("So 8\n#### 8", 1.0, 0.0),  # 2 words are not working
        ("one two three four five\n#### 8", 1.0, 1.0),  # exactly MIN_WORKING_WORDS
        ("Tom has 3 + 5 = 8 apples.", 0.0, 0.0),  # right in prose: neither pays
        ("We add them: 3 + 5 gives \\boxed{8}", 1.0, 1.0),  # a boxed answer: the words before the box
        ("\\boxed{8}", 1.0, 0.0),
        ("Tom has 3 + 5 = 8 apples.\n#### 8\nThanks!", 0.0, 0.0),  # text after the #### line: no strict answer
    ],
)
def test_strict_form_rewards_pay_only_with_an_answer_or_after_working(completion, strict_correct, after_working):
    assert strict_correct_reward("q", completion, "8") == strict_correct
    assert format_after_working_reward("q", completion, "8") == after_working
    # strict_correct ignores the run's rule: a prose answer is right under flexible but earns no strict bonus
    assert strict_correct_reward("q", completion, "8", answer_match="flexible", correct=1.0) == strict_correct


def test_the_cpu_recipe_ranks_a_stated_right_answer_over_prose_over_a_bare_form():
    """The recipe of the CPU word-problems preset: accuracy 1 (flexible) + strict_correct 1 + format_after_working
    0.05. A right answer after working and '####' earns 2.05, the same in prose 1, a wrong one stated after working
    0.05, a bare right '#### 8' 2 and a bare wrong one 0: the form alone is worth at most 0.05."""
    rewards = PRESETS[WORD_PROBLEMS_CPU]["rewards"]
    texts = ["Tom has 3 + 5 = 8 apples.\n#### 8", "Tom has 3 + 5 = 8 apples.", "Tom has 3 + 5 = 9 apples.\n#### 9"]
    texts += ["#### 8", "#### 9"]
    outputs = [{"question": "q", "completion": t, "reference": "8", "row": {"answer_match": "flexible"}} for t in texts]
    totals = [round(total, 4) for total, _ in score_outputs(rewards, outputs)]
    assert totals == [2.05, 1.0, 0.05, 2.0, 0.0]


@pytest.mark.parametrize(
    "tokens, right, expected",
    [
        (0, True, 1.0),
        (8, True, 0.5 + 0.25 * (1 + math.cos(math.pi / 4))),
        (16, True, 0.75),
        (32, True, 0.5),
        (64, True, 0.5),
        (0, False, -1.0),
        (8, False, -0.5 - 0.25 * (1 + math.cos(math.pi / 4))),
        (32, False, -0.5),
    ],
)
def test_length_is_cosine_scaled(tokens, right, expected):
    completion = "#### 14" if right else "#### 15"
    value = length_reward("q", completion, "14", completion_tokens=tokens, max_new_tokens=32)
    assert value == pytest.approx(expected)
    if tokens == 8:
        assert value == pytest.approx(0.9268 if right else -0.9268, abs=1e-4)


def test_length_without_a_token_count_counts_characters_over_four():
    # 64 characters = 16 "tokens" of 32: halfway, cos(pi/2) = 0, right: 0.5 + 0.25 = 0.75
    completion = "x" * 56 + "\n#### 14"
    assert len(completion) == 64
    assert length_reward("q", completion, "14", max_new_tokens=32) == pytest.approx(0.75)


def test_repetition_penalises_repeated_trigrams():
    assert repetition_reward("q", "a b a b a b", "x") == pytest.approx(-0.5)  # 2 unique 3-grams of 4
    assert repetition_reward("q", "one two three four", "x") == 0.0  # all unique
    assert repetition_reward("q", "x x x x x x", "x") == pytest.approx(-0.75)  # 1 unique of 4
    assert repetition_reward("q", "two words", "x") == 0.0  # fewer than 3 words
    assert repetition_reward("q", "A b a B a b", "x") == pytest.approx(-0.5)  # lower-cased


def test_weighted_sum_and_unweighted_components():
    out = {
        "question": "q",
        "completion": "a b a b a b\n#### 14",
        "reference": "14",
        "row": {"completion_tokens": 16, "max_new_tokens": 32},
    }
    rewards = [
        {"name": "accuracy", "weight": 1.0},
        {"name": "length", "weight": 0.5},
        {"name": "repetition", "weight": 2.0},
        {"name": "format", "weight": 0.1},
    ]
    total, parts = score_outputs(rewards, [out])[0]
    # 3-grams of "a b a b a b #### 14": aba bab aba bab ab#### b####14 -> 4 unique of 6: -(1 - 4/6) = -1/3
    assert parts == pytest.approx({"accuracy": 1.0, "length": 0.75, "repetition": -1 / 3, "format": 1.0})
    assert total == pytest.approx(1.0 + 0.5 * 0.75 + 2.0 * (-1 / 3) + 0.1 * 1.0)


class _Judged:
    """The parts of step.Judged that named_rewards reads."""

    def __init__(self, texts, correct, steps=None):
        self.texts = texts
        self.outcome = [(c, {"correct": c, "formatted": 1.0}) for c in correct]
        self.steps = steps or [[] for _ in texts]
        self.verdicts = [[1.0] * len(s) for s in self.steps]


def test_named_rewards_keep_the_verifier_and_add_the_named_components():
    spec = validate_spec({"rewards": [{"name": "accuracy"}, {"name": "length", "weight": 0.5}], "max_new_tokens": 32})
    judged = _Judged(["#### 14", "#### 15"], [1.0, 0.0])
    rows = [{"question": "q", "answer": "14", "solution": ""}] * 2
    outcome, verdicts = named_rewards(spec, judged, rows, [8, 32])
    (r0, c0), (r1, c1) = outcome
    assert c0["correct"] == 1.0 and c1["correct"] == 0.0  # correct_frac still has its verdict
    assert c0["length"] == pytest.approx(0.9268, abs=1e-4) and c1["length"] == pytest.approx(-0.5)
    assert r0 == pytest.approx(1.0 + 0.5 * c0["length"]) and r1 == pytest.approx(0.0 + 0.5 * -0.5)
    assert verdicts is judged.verdicts
    assert reward_means([c0, c1], spec.rewards) == pytest.approx(
        {"reward/accuracy": 0.5, "reward/length": (c0["length"] - 0.5) / 2}
    )


@pytest.mark.parametrize(
    "rewards, words",
    [
        ([{"name": "brevity"}], "unknown reward 'brevity': the built-ins are accuracy, format, length, repetition"),
        ([{"name": "length", "weight": "heavy"}], "weight must be a finite number"),
        ([{"name": "length", "weight": float("inf")}], "weight must be a finite number"),
        ([{"name": "length", "weight": True}], "weight must be a finite number"),
        ([{"name": "length"}, {"name": "length", "weight": 2}], "'length' is given twice"),
        ([{"name": "length", "scale": 2}], "must be an object"),
        (["length"], "must be an object"),
        ({"name": "length"}, "must be a list"),
        ("[{'name': 'length'}]", "not JSON"),
    ],
)
def test_bad_rewards_are_refused_naming_the_key(rewards, words):
    with pytest.raises(SpecError) as refused:
        validate_spec({"rewards": rewards})
    assert refused.value.key == "rewards" and words in str(refused.value)


def test_rewards_that_would_not_be_used_as_asked_are_refused():
    # format_reward is not read beside named rewards (the "format" reward replaces it): the refusal names it
    with pytest.raises(
        SpecError, match='format_reward: is replaced by the named rewards.*"name": "format", "weight": 0.1'
    ):
        validate_spec({"rewards": [{"name": "accuracy"}], "format_reward": 0.1})
    with pytest.raises(SpecError, match="rewards: 'length' is an outcome reward.*only hold custom functions"):
        validate_spec({"rewards": [{"name": "length"}], "supervision": "process"})
    with pytest.raises(SpecError, match="rewards: .*with reward 'model'"):
        validate_spec({"rewards": [{"name": "accuracy"}], "reward": "model"})
    # custom names pass the spec's checks (launch checks the switch and the places), with process too
    spec = validate_spec({"rewards": [{"name": "/data/r.py:steps"}], "supervision": "process"})
    assert spec.rewards == [{"name": "/data/r.py:steps", "weight": 1.0}]


def test_rewards_from_the_form_as_json_text_and_round_trip():
    spec = validate_spec({"rewards": '[{"name": "length", "weight": 0.5}, {"name": "accuracy"}]'})
    assert spec.rewards == [{"name": "length", "weight": 0.5}, {"name": "accuracy", "weight": 1.0}]
    assert validate_spec(spec.to_dict()) == spec
    assert validate_spec({"rewards": ""}).rewards == [] == validate_spec({}).rewards
    assert set(BUILTINS) == {"accuracy", "format", "length", "repetition", "strict_correct", "format_after_working"}


def test_reward_metrics_are_charted_in_the_reward_panel_and_not_required_every_step():
    assert not any(name.startswith("reward/") for name in METRICS)  # only runs with rewards record them
    rows = [{"step": 1, "iteration": 1, "reward_mean": 0.5, "reward/length": 0.3, "reward/accuracy": 1.0, "kl": 0.1}]
    panels = dict(chart_panels(rows))
    assert panels["reward"] == ("reward_mean", "reward/accuracy", "reward/length") and "other" not in panels


def test_group_view_shows_each_named_reward_with_its_weight_and_the_total():
    page = components_html(
        {"correct": 1.0, "formatted": 1.0, "accuracy": 1.0, "length": 0.42}, {"accuracy": 1.0, "length": 0.5}
    )
    assert "correct 1 ✓" in page and "accuracy 1 × 1" in page and "length 0.42 × 0.5" in page
    assert "weighted total 1.21" in page
    assert "length 0.42" in components_html({"length": 0.42}) and "×" not in components_html({"length": 0.42})
