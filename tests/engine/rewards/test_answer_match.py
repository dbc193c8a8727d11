"""answer_match: the final answer under the 'strict' and 'flexible' rules (rewards.last_number, final_answer),
outcome_reward under each (its ``formatted`` always the strict form's), the built-in accuracy reward's verdict and
the reward preview under the run's rule. Hand-made texts with their numbers worked out here."""

from __future__ import annotations

import pytest

from grpo_engine.rewards.builtin_rewards import accuracy_reward, format_reward
from grpo_engine.rewards.reward_functions import named_rewards
from grpo_engine.rewards.reward_preview import preview
from grpo_engine.rewards.rewards import _reference_final_answer, final_answer, last_number, outcome_reward

# --- last_number: lm-eval's flexible-extract, (text, number) -----------------------------------------------


@pytest.mark.parametrize(
    "text, number",
    [
        ("so she has 3 + 5 = 8 apples.", "8"),
        ("Tom pays 1,000 dollars", "1000"),  # thousands separators go
        ("It costs $18.", "18"),  # the dollar sign and the trailing period go
        ("The total is $1,234.50 in all", "1234.50"),
        ("The temperature fell to -3 degrees", "-3"),
        ("3 - 5 = -2", "-2"),
        ("It is 0.5.", "0.5"),
        ("Natalia sold 48 clips in April and 48/2 = 24 in May, so 48 + 24 = 72 in all", "72"),
        ("The answer is 12, I think.", "12"),
        ("She had 7 apples... ", "7"),  # an ellipsis has no digit: the number before it
        ("the answer is forty-two", None),
        ("", None),
    ],
)
def test_last_number(text, number):
    assert last_number(text) == number


# --- final_answer: (completion, strict, flexible) ------------------------------------------------------------


@pytest.mark.parametrize(
    "completion, strict, flexible",
    [
        ("Tom has 3 + 5 = 8 apples.", (None, "none"), ("8", "number")),
        ("#### 14", ("14", "gsm8k"), ("14", "gsm8k")),  # the strict answer under both rules
        ("3*4=12\n2+12=14\n#### 14", ("14", "gsm8k"), ("14", "gsm8k")),
        ("so \\boxed{7}, not 9", ("7", "boxed"), ("7", "boxed")),  # a box wins over a later number
        ("#### 14 apples", (None, "none"), ("14", "number")),  # prose after ####: strict none, the number counts
        ("#### 14\nso 15", (None, "none"), ("15", "number")),  # text after the answer line: its last number
        ("I do not know", (None, "none"), (None, "none")),
        ("", (None, "none"), (None, "none")),
    ],
)
def test_final_answer_under_each_rule(completion, strict, flexible):
    assert final_answer(completion) == final_answer(completion, "strict") == strict
    assert final_answer(completion, "flexible") == flexible


# --- a #### line without a number: the issue's two outputs and their neighbours ------------------------------

EVA = "Eva had 8 stickers and gave 5 away, so 8 - 5 = 3 stickers left."


@pytest.mark.parametrize(
    "completion, strict, flexible",
    [
        # hashes alone after the prose: no stated answer, so flexible reads the last number
        (
            f"{EVA}\n######## Eva ended up with 3 stickers without surrendering!\n########",
            (None, "none"),
            ("3", "number"),
        ),
        (f"{EVA}\n######## Eva has 3 stickers left", (None, "none"), ("3", "number")),  # prose after the hashes
        (f"{EVA}\n######## 3", ("3", "gsm8k"), ("3", "gsm8k")),  # extra hashes before a number: it is stated
        (f"{EVA}\n########3", ("3", "gsm8k"), ("3", "gsm8k")),
        (f"{EVA}\n#### 4", ("4", "gsm8k"), ("4", "gsm8k")),  # a stated wrong answer stays the answer
        (f"{EVA}\n####", (None, "none"), ("3", "number")),
        (f"{EVA}\n#### .", (None, "none"), ("3", "number")),  # no letter or digit after the hashes
        (f"{EVA}\n#### $", (None, "none"), ("3", "number")),
        (f"{EVA}\n#### ## ##", (None, "none"), ("3", "number")),  # hashes and spaces only
        (f"{EVA}\n#### x", ("x", "gsm8k"), ("x", "gsm8k")),  # a letter: an expression, stated
        ("so \\boxed{3}\n########", ("3", "boxed"), ("3", "boxed")),  # an empty #### line: the box still counts
        ("########", (None, "none"), (None, "none")),  # nothing else to read
    ],
)
def test_a_hash_line_without_an_answer_states_none(completion, strict, flexible):
    assert final_answer(completion) == strict
    assert final_answer(completion, "flexible") == flexible


@pytest.mark.parametrize(
    "completion, strict, flexible, formatted",
    [  # the issue's outputs with format_reward 0.1: right under flexible, the format reward not paid
        (f"{EVA}\n######## Eva ended up with 3 stickers without surrendering!\n########", 0.0, 1.0, 0.0),
        (f"{EVA}\n######## Eva has 3 stickers left", 0.0, 1.0, 0.0),
        (f"{EVA}\n######## 3", 1.0, 1.0, 1.0),
        (f"{EVA}\n#### .", 0.0, 1.0, 0.0),
    ],
)
def test_the_issues_outputs_are_scored_as_they_read(completion, strict, flexible, formatted):
    for match, correct in (("strict", strict), ("flexible", flexible)):
        assert outcome_reward(completion, "3", 0.1, match) == (
            pytest.approx(correct + 0.1 * formatted),
            {"correct": correct, "formatted": formatted, "format": pytest.approx(0.1 * formatted)},
        )


def test_a_reference_is_read_as_an_output():
    """A reference's #### line with extra hashes states its number; a #### line with no letter or digit states
    nothing, so its box is the answer."""
    assert _reference_final_answer("8 - 5 = 3\n######## 3") == "3"
    assert _reference_final_answer("\\boxed{3}\n#### .") == "3"
    assert outcome_reward("#### 3", "\\boxed{3}\n#### .")[0] == 1.0


def test_an_unknown_rule_is_refused():
    with pytest.raises(ValueError, match="strict, flexible"):
        final_answer("#### 1", "loose")


# --- outcome_reward: (completion, reference, strict correct, flexible correct, formatted) --------------------

QUESTION = "Tom has 3 apples and buys 5 more. How many apples does he have?"

OUTCOME_CASES = [
    ("so she has 3 + 5 = 8 apples.", "8", 0.0, 1.0, 0.0),  # right in prose: only flexible counts it
    ("#### 14", "14", 1.0, 1.0, 1.0),
    ("#### 13", "14", 0.0, 0.0, 1.0),
    ("He pays 1,000 dollars", "1000", 0.0, 1.0, 0.0),
    ("He pays 1,000 dollars", "1,000", 0.0, 1.0, 0.0),
    ("The temperature is -3 degrees.", "-3", 0.0, 1.0, 0.0),  # negative
    ("The answer is 42.", "42", 0.0, 1.0, 0.0),  # a trailing period
    ("Tom has 3 apples. He buys 5 more, so he has 3 + 5 = 8.", "8", 0.0, 1.0, 0.0),  # question's 3 echoed first
    ("Tom has 8 apples, then 3 + 5 = 9.", "8", 0.0, 0.0, 0.0),  # the last number, not the first
    ("3 + 5 = 8\n#### 9", "8", 0.0, 0.0, 1.0),  # a stated wrong answer: no falling back to an earlier number
    ("The answer is $\\boxed{\\frac{1}{2}}$, about 0.4", "0.5", 1.0, 1.0, 1.0),
    ("The share is 0.5", "\\frac{1}{2}", 0.0, 1.0, 0.0),  # the last number compared as mathematics
    ("He has 8 apples", "Tom has 3 + 5 = <<3+5=8>>8 apples.\n#### 8", 0.0, 1.0, 0.0),  # a GSM8K solution
    ("no idea", "8", 0.0, 0.0, 0.0),
]


@pytest.mark.parametrize("completion, reference, strict, flexible, formatted", OUTCOME_CASES)
def test_outcome_reward_under_each_rule(completion, reference, strict, flexible, formatted):
    assert outcome_reward(completion, reference) == (strict, {"correct": strict, "formatted": formatted})
    assert outcome_reward(completion, reference, match="flexible") == (
        flexible,
        {"correct": flexible, "formatted": formatted},
    )


def test_the_format_reward_pays_the_strict_form_whatever_the_rule():
    prose, stated = "so she has 3 + 5 = 8 apples.", "3 + 5 = 8\n#### 8"
    assert outcome_reward(prose, "8", format_weight=0.5, match="flexible") == (
        1.0,
        {"correct": 1.0, "formatted": 0.0, "format": 0.0},
    )
    assert outcome_reward(stated, "8", format_weight=0.5, match="flexible") == (
        1.5,
        {"correct": 1.0, "formatted": 1.0, "format": 0.5},
    )
    assert format_reward("q", prose, "8") == 0.0 and format_reward("q", stated, "8") == 1.0


# --- the built-in accuracy reward ----------------------------------------------------------------------------


def test_accuracy_takes_the_engines_verdict_else_judges_under_the_rows_rule():
    prose = "so she has 3 + 5 = 8 apples."
    assert accuracy_reward(QUESTION, prose, "8") == 0.0  # strict when no rule is given
    assert accuracy_reward(QUESTION, prose, "8", answer_match="strict") == 0.0
    assert accuracy_reward(QUESTION, prose, "8", answer_match="flexible") == 1.0
    assert accuracy_reward(QUESTION, prose, "8", correct=0.0, answer_match="flexible") == 0.0  # the engine's


class _Spec:
    supervision, max_new_tokens, rewards = "outcome", 32, ({"name": "accuracy", "weight": 1.0},)

    def __init__(self, answer_match: str):
        self.answer_match = answer_match


class _Judged:
    def __init__(self, texts: list[str], match: str):
        self.texts, self.verdicts = texts, []
        self.outcome = [outcome_reward(t, "8", match=match) for t in texts]


@pytest.mark.parametrize("match, expected", [("strict", [0.0, 1.0]), ("flexible", [1.0, 1.0])])
def test_named_rewards_pass_the_runs_rule_and_its_verdict(match, expected):
    texts = ["so she has 3 + 5 = 8 apples.", "#### 8"]
    rows = [{"question": QUESTION, "answer": "8"}] * 2
    outcome, _ = named_rewards(_Spec(match), _Judged(texts, match), rows, [10, 4])
    assert [reward for reward, _ in outcome] == expected
    assert [parts["accuracy"] for _, parts in outcome] == [parts["correct"] for _, parts in outcome]


def test_the_reward_preview_judges_under_the_requests_rule():
    request = {
        "rewards": [{"name": "accuracy", "weight": 1.0}],
        "max_new_tokens": 32,
        "rows": [{"question": QUESTION, "answer": "8", "solution": "Tom has 3 + 5 = 8 apples."}],
    }
    assert preview(request)["rows"][0]["reward"] == 0.0
    assert preview({**request, "answer_match": "strict"})["rows"][0]["reward"] == 0.0
    assert preview({**request, "answer_match": "flexible"})["rows"][0]["reward"] == 1.0
