"""Answer checking (answers_match, extract_final_answer, outcome_reward with its format reward),
Math-Shepherd rows (parse_math_shepherd). Pure Python; math-verify on the
non-plain answers."""

from __future__ import annotations

import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from grpo_engine.data.math_shepherd import parse_math_shepherd
from grpo_engine.rewards.rewards import (
    MAX_ANSWER_CHARS,
    answers_match,
    extract_final_answer,
    outcome_reward,
)

# --- answers_match: (predicted, reference, equal) -------------------------------------------------

ANSWER_CASES = [
    # plain numbers (the fast path, no sympy)
    ("14", "14", True),
    ("14.0", "14", True),
    ("14.", "14", True),  # a sentence's full stop
    ("1,000", "1000", True),
    ("$1,000", "1000", True),  # a dollar amount
    ("$18$", "18", True),  # inline LaTeX
    ("- 3", "-3", True),
    ("+3", "3", True),
    ("-3", "3", False),
    ("0.1", "0.10000000001", True),  # within 1e-9 relative
    ("0.1", "0.1001", False),
    ("12345678901234567890", "12345678901234567891", False),  # integers compared exactly
    ("13", "14", False),
    # fractions, decimals and LaTeX forms (math-verify)
    ("0.5", r"\frac{1}{2}", True),
    ("1/2", "0.5", True),
    (r"\dfrac{1}{2}", "0.5", True),
    (r"\frac12", "1/2", True),
    (r"\frac{1}{3}", "0.33", False),
    (r"2\sqrt{2}", r"\sqrt{8}", True),
    (r"\sqrt{2}/2", r"\frac{\sqrt{2}}{2}", True),
    (r"\sqrt{2}", r"\sqrt{3}", False),
    ("(x+1)^2", "x^2+2x+1", True),
    ("x^2+1", "x^2+2x+1", False),
    # percent: math-verify's rule, both readings match
    (r"50\%", "0.5", True),
    (r"50\%", "50", True),
    ("50%", "50", True),
    (r"40\%", "0.5", False),
    # assignments: x=3 counts as 3
    ("x=3", "3", True),
    ("x = 3", "3", True),
    ("3", "x=3", True),
    ("x=4", "3", False),
    # intervals and sets
    ("[1,2)", "[1,2)", True),
    ("[1,2)", "(1,2)", False),
    (r"\{2,1\}", r"\{1,2\}", True),  # a set has no order
    (r"\{1,3\}", r"\{1,2\}", False),
    # units and text
    (r"5\text{ cm}", "5", True),
    (r"\text{Monday}", r"\text{monday}", True),
    # an unevaluated computation is never an answer (on the built-in task it is the question)
    ("2+3*4", "14", False),
    (r"2+3\times 4", "14", False),
    ("x = 12 + 2", "14", False),
    ("(2+3)*4", "20", False),
    ("2+12=14", "14", True),  # an equation ending in the value states it
    # malformed and hostile answers
    ("", "14", False),
    ("}{", "14", False),
    (r"\frac{1}{", "0.5", False),
    ("fourteen", "14", False),
    ("14", "fourteen", False),
    (r"9^{9^{9}}", "14", False),  # a tower of powers is not compared (it would not finish)
    ("99999999999^{99999999999}", "14", False),
    ("1" * (MAX_ANSWER_CHARS + 1), "1" * (MAX_ANSWER_CHARS + 1), True),  # plain numbers: any length
    ("(" * 40 + "14" + ")" * 40, "14", False),  # too deeply nested to parse quickly
    ("(1" + " +1" * 5000 + "x", "14", False),  # long, and no regex may backtrack on it
]


@pytest.mark.parametrize("predicted, reference, equal", ANSWER_CASES)
def test_answers_match(predicted, reference, equal):
    assert answers_match(predicted, reference) is equal


def test_answers_match_works_off_the_main_thread():
    # math-verify's signal timeouts only work on the main thread; elsewhere it runs without them
    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda case: answers_match(case[0], case[1]), ANSWER_CASES))
    assert got == [equal for _, _, equal in ANSWER_CASES]


def test_errors_and_timeouts_inside_math_verify_count_as_not_equal(monkeypatch):
    import math_verify
    from math_verify.errors import TimeoutException

    def boom(exception):
        def raise_it(*args, **kwargs):
            raise exception

        return raise_it

    for exception in (TimeoutException("Operation timed out!"), RuntimeError("boom"), RecursionError()):
        monkeypatch.setattr(math_verify, "verify", boom(exception))
        assert answers_match("0.5", r"\frac{1}{2}") is False
        monkeypatch.setattr(math_verify, "parse", boom(exception))
        assert answers_match("0.5", r"\frac{1}{2}") is False
    assert answers_match("14", "14.0") is True  # plain numbers never reach math-verify


def test_plain_numbers_do_not_import_sympy():
    code = (
        "import sys\n"
        "from grpo_engine.rewards.rewards import answers_match, outcome_reward\n"
        "assert answers_match('14', '14.0') and answers_match('-3', '- 3') and not answers_match('1,000', '100')\n"
        "assert outcome_reward('3*4=12\\n2+12=14\\n#### 14', '14')[0] == 1.0\n"
        "assert outcome_reward('#### 20', '14')[0] == 0.0\n"
        "assert 'sympy' not in sys.modules and 'math_verify' not in sys.modules, 'sympy imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


# --- extract_final_answer ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("3*4=12\n2+12=14\n#### 14", ("14", "gsm8k")),
        ("####14\n\n", ("14", "gsm8k")),
        ("#### \\frac{1}{2}", ("\\frac{1}{2}", "gsm8k")),  # GSM8K form, an expression
        ("#### x = 3", ("x = 3", "gsm8k")),
        ("#### 5 \\text{ cm}", ("5 \\text{ cm}", "gsm8k")),
        ("#### 12\n#### 14", ("14", "gsm8k")),  # the last line counts
        ("#### 14 apples", (None, "none")),  # prose after the number: not an answer
        ("#### 14\nso the answer is 14", (None, "none")),  # text after the answer line
        ("####", (None, "none")),
        ("So the answer is $\\boxed{\\frac{1}{2}}$.", ("\\frac{1}{2}", "boxed")),
        ("\\boxed{1} then \\boxed{2}", ("2", "boxed")),  # the last box
        ("\\boxed{\\{1,2\\}}", ("\\{1,2\\}", "boxed")),  # escaped braces are not grouping
        ("\\fbox{7}", ("7", "boxed")),
        ("\\boxed {x=3}", ("x=3", "boxed")),
        ("#### 14 apples\n\\boxed{14}", ("14", "boxed")),  # no #### answer: the box counts
        ("\\boxed{12} and finally \\boxed{\\frac{1}{", (None, "none")),  # the last box is never closed
        ("\\boxed{}", (None, "none")),  # empty box
        ("\\boxed{ }", (None, "none")),
        ("the answer is 14", (None, "none")),
        ("", (None, "none")),
    ],
)
def test_extract_final_answer(completion, expected):
    assert extract_final_answer(completion) == expected


# --- outcome_reward: (completion, reference, format_weight, total, correct, formatted) ---------------

OUTCOME_CASES = [
    ("3*4=12\n2+12=14\n#### 14", "14", 0.0, 1.0, 1.0, 1.0),  # the built-in form
    ("#### 20", "14", 0.0, 0.0, 0.0, 1.0),
    ("#### 2+3*4", "14", 0.0, 0.0, 0.0, 1.0),  # copying the question is no answer
    ("#### 1,000", "1000", 0.0, 1.0, 1.0, 1.0),
    ("The answer is $\\boxed{\\dfrac{1}{2}}$.", "0.5", 0.0, 1.0, 1.0, 1.0),
    ("$\\boxed{2\\sqrt{2}}$", "\\sqrt{8}", 0.0, 1.0, 1.0, 1.0),
    ("so \\boxed{x=3}", "3", 0.0, 1.0, 1.0, 1.0),
    ("\\boxed{50\\%}", "0.5", 0.0, 1.0, 1.0, 1.0),
    ("#### 72", "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72", 0.0, 1.0, 1.0, 1.0),  # a GSM8K solution
    ("\\boxed{\\frac{1}{2}}", "Hence $p = \\boxed{\\frac{2}{4}}$.", 0.0, 1.0, 1.0, 1.0),  # a MATH solution
    ("\\boxed{\\frac{1}{3}}", "Hence $p = \\boxed{\\frac{2}{4}}$.", 0.0, 0.0, 0.0, 1.0),
    ("no final answer here", "14", 0.0, 0.0, 0.0, 0.0),
    ("\\boxed{14", "14", 0.0, 0.0, 0.0, 0.0),  # unbalanced
    ("\\boxed{}", "14", 0.0, 0.0, 0.0, 0.0),
    ("#$%^&*(", "14", 0.0, 0.0, 0.0, 0.0),  # garbage
    ("blah " * 20_000 + "\n#### 14", "14", 0.0, 1.0, 1.0, 1.0),  # very long text
    ("\\boxed{" + "1+" * 1000 + "1}", "1001", 0.0, 0.0, 0.0, 1.0),  # a very long answer
    # the format reward
    ("#### 14", "14", 0.5, 1.5, 1.0, 1.0),
    ("#### 13", "14", 0.5, 0.5, 0.0, 1.0),
    ("no answer", "14", 0.5, 0.0, 0.0, 0.0),
    ("\\boxed{13}", "14", 0.1, 0.1, 0.0, 1.0),
]


@pytest.mark.parametrize("completion, reference, format_weight, total, correct, formatted", OUTCOME_CASES)
def test_outcome_reward(completion, reference, format_weight, total, correct, formatted):
    got_total, components = outcome_reward(completion, reference, format_weight=format_weight)
    assert got_total == pytest.approx(total)
    expected = {"correct": correct, "formatted": formatted}
    if format_weight > 0:
        expected["format"] = format_weight * formatted
    assert components == pytest.approx(expected) and set(components) == set(expected)


def test_outcome_reward_keeps_the_two_argument_call():
    assert outcome_reward("#### 14", "14") == (1.0, {"correct": 1.0, "formatted": 1.0})
    assert outcome_reward("#### 14", "14", 0.0) == (1.0, {"correct": 1.0, "formatted": 1.0})


# --- Math-Shepherd -------------------------------------------------------------------------------


def _row(question: str, steps: list[str], marks: str, sep: str = " ") -> tuple[str, str]:
    """A row in the dataset's layout: question, then steps each ending with ' ки', one per line."""
    body = "\n".join(f"{s} ки" for s in steps)
    label = "\n".join(f"{s} {m}" for s, m in zip(steps, marks, strict=True))
    return question + sep + body, question + sep + label


GSM_QUESTION = (
    "Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins "
    "for her friends every day with four. She sells the remainder at the farmers' market daily for $2 "
    "per fresh duck egg. How much in dollars does she make every day at the farmers' market?"
)
GSM_STEPS = [
    "Step 1: Janet's ducks lay 16 eggs per day.",
    "Step 2: She eats 3 for breakfast, so she has 16 - 3 = <<16-3=13>>13 eggs left.",
    "Step 3: She bakes muffins with 4 eggs, so she has 13 - 4 = <<13-4=9>>9 eggs left.",
    "Step 4: She sells them for $2 each, so she makes 9 * 2 = $<<9*2=18>>18. The answer is: 18",
]
MATH_QUESTION = r"What is the value of $\sqrt{36 \times \sqrt{16}}$?"
MATH_STEPS = [
    r"Step 1: First, we simplify $\sqrt{16}$ to get $4$.",
    r"Step 2: Then, $36 \times 4 = 144$.",
    r"Step 3: Finally, $\sqrt{144} = 14$. The answer is: 14",
]


def test_parse_math_shepherd_gsm8k_row():
    input_text, label_text = _row(GSM_QUESTION, GSM_STEPS, "++++")
    assert len(label_text) == len(input_text) - len(GSM_STEPS)  # 'ки' is two characters, '+' one
    question, steps, labels = parse_math_shepherd(input_text, label_text)
    assert question == GSM_QUESTION
    assert steps == GSM_STEPS
    assert labels == [1.0, 1.0, 1.0, 1.0]


def test_parse_math_shepherd_math_row_with_a_bad_step():
    input_text, label_text = _row(MATH_QUESTION, MATH_STEPS, "++-", sep="\n")
    question, steps, labels = parse_math_shepherd(input_text, label_text)
    assert (question, steps, labels) == (MATH_QUESTION, MATH_STEPS, [1.0, 1.0, 0.0])


def test_parse_math_shepherd_without_step_numbers_splits_after_the_question_mark():
    steps = ["Each cat has 4 legs.", "3 * 4 = 12. The answer is: 12"]
    input_text, label_text = _row("How many legs do 3 cats have?", steps, "+-")
    assert parse_math_shepherd(input_text, label_text) == ("How many legs do 3 cats have?", steps, [1.0, 0.0])


def test_parse_math_shepherd_with_another_tag():
    input_text = "What is 2+2? Step 1: 2+2=4. <s>\nStep 2: The answer is: 4 <s>\n"
    label_text = "What is 2+2? Step 1: 2+2=4. -\nStep 2: The answer is: 4 +\n"
    assert parse_math_shepherd(input_text, label_text, tag="<s>") == (
        "What is 2+2?",
        ["Step 1: 2+2=4.", "Step 2: The answer is: 4"],
        [0.0, 1.0],
    )


TWO_STEPS = "Q? Step 1: a ки\nStep 2: b ки"


@pytest.mark.parametrize(
    "input_text, label_text, message",
    [
        (TWO_STEPS, "Q? Step 1: a +\nStep 2: b x", "the label of step 2 is 'x', not '+' or '-'"),
        (
            TWO_STEPS,
            "Q? Step 1: a +\nStep 2: c +",
            "the label text differs from the input at character 23 (step 2): 'c +' where the input has 'b '",
        ),
        (TWO_STEPS, "Q? Step 1: a +\nStep 2: b ", "the label text ends before the label of step 2"),
        (TWO_STEPS, "Q? Step 1: a +\nStep 2: b +\nmore", "the label text goes on after the last step"),
        (TWO_STEPS, "Q? Step 1: a ки\nStep 2: b ки", "the label of step 1 is 'к'"),  # the input again
        ("Q? Step 1: a", "Q? Step 1: a", "the input has no step tag 'ки'"),
        ("Q? Step 1: a ки then more", "Q? Step 1: a + then more", "text after the last step tag"),
        ("Q? Step 1: a ки ки", "Q? Step 1: a + +", "step 2 is empty"),
        ("No question mark ки", "No question mark +", "cannot tell where the question ends"),
        ("Mr. R ки? Step 1: a ки", "Mr. R +? Step 1: a +", "a step tag 'ки' comes before 'Step 1:'"),
        ("Step 1: a ки", "Step 1: a +", "the question is empty"),
    ],
)
def test_parse_math_shepherd_refuses_bad_rows(input_text, label_text, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        parse_math_shepherd(input_text, label_text)
