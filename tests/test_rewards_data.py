"""The verifier, the step checker, the built-in dataset and the trainer's small token helpers."""
from __future__ import annotations

import pytest
import torch

from grpo_engine.data import (
    HELDOUT_SIZE,
    PRECEDENCE_SHARE,
    builtin_examples,
    load_dataset,
    solve,
    warmup_examples,
)
from grpo_engine.rewards import check_step, extract_answer, outcome_reward, split_steps
from grpo_engine.trainer import completion_mask, step_boundaries


# --- the verifier (outcome reward) -----------------------------------------------------------

@pytest.mark.parametrize("completion, answer", [
    ("3*4=12\n2+12=14\n#### 14", "14"),
    ("#### 14", "14"),
    ("####14", "14"),
    ("#### 14  \n\n", "14"),  # trailing blank lines and spaces are fine
    ("3*4=12\n2-12=-10\n#### -10", "-10"),  # negative numbers
    ("#### 2.5", "2.5"),
    ("#### 12\n#### 14", "14"),  # the last answer line counts
    ("2+3*4=14", None),  # no "####" line
    ("", None),
    ("#### 14 apples", None),  # junk after the number
    ("#### 14\nso the answer is 14", None),  # junk line after the answer line
    ("#### fourteen", None),
])
def test_extract_answer(completion, answer):
    assert extract_answer(completion) == answer


@pytest.mark.parametrize("completion, reference, reward, formatted", [
    ("3*4=12\n2+12=14\n#### 14", "14", 1.0, 1.0),  # right
    ("2+3=5\n5*4=20\n#### 20", "14", 0.0, 1.0),  # wrong
    ("3*4=12\n2+12=14", "14", 0.0, 0.0),  # missing "####"
    ("#### 14 and more", "14", 0.0, 0.0),  # junk after
    ("3*4=12\n2-12=-10\n#### -10", "-10", 1.0, 1.0),  # negative, right
    ("#### 10", "-10", 0.0, 1.0),  # sign matters
    ("#### 14.0", "14", 1.0, 1.0),  # compared as numbers
    ("#### 14", "fourteen", 0.0, 1.0),  # a non-numeric reference is no error
])
def test_outcome_reward(completion, reference, reward, formatted):
    total, components = outcome_reward(completion, reference)
    assert total == reward
    assert components == {"correct": reward, "formatted": formatted}


# --- the step checker (process reward) -------------------------------------------------------

def test_check_step_accepts_a_right_solution_step_by_step():
    q = "2+3*4"
    assert check_step("3*4=12", q, [])
    assert check_step("2+12=14", q, ["3*4=12"])
    assert check_step("#### 14", q, ["3*4=12", "2+12=14"])
    assert check_step("  3*4=12 ", q, [])  # surrounding spaces are ignored
    assert check_step("2*3=6", "2*3+4", [])  # no precedence issue: left to right is right
    assert check_step("6+4=10", "2*3+4", ["2*3=6"])
    assert check_step("3*4=12", "2-3*4", [])
    assert check_step("2-12=-10", "2-3*4", ["3*4=12"])
    assert check_step("#### -10", "2-3*4", ["3*4=12", "2-12=-10"])


def test_check_step_refuses_wrong_arithmetic():
    assert not check_step("3*4=13", "2+3*4", [])
    assert not check_step("2+12=15", "2+3*4", ["3*4=12"])
    assert not check_step("#### 15", "2+3*4", ["3*4=12", "2+12=14"])


def test_check_step_refuses_steps_that_violate_precedence():
    q = "2+3*4"
    assert not check_step("2+3=5", q, [])  # right arithmetic, wrong order
    assert not check_step("5*4=20", q, ["2+3=5"])
    assert not check_step("#### 20", q, ["2+3=5", "5*4=20"])


def test_check_step_refuses_out_of_place_steps():
    q = "2+3*4"
    assert not check_step("#### 14", q, ["3*4=12"])  # the answer line too early
    assert not check_step("#### 14", q, ["3*4=12", "2+12=14", "#### 14"])  # a step after the answer
    assert not check_step("3*4=12", "2+3*4+5", [])  # not a built-in question


def test_split_steps():
    assert split_steps("3*4=12\n\n2+12=14\n#### 14\n") == ["3*4=12", "2+12=14", "#### 14"]
    assert split_steps("") == []
    assert split_steps(" \n\n") == []


# --- the built-in dataset --------------------------------------------------------------------

def _is_precedence_shape(q: str) -> bool:
    return q[1] in "+-" and q[3] == "*"


def test_builtin_heldout_split_is_fixed_and_disjoint():
    train, heldout = builtin_examples()
    train2, heldout2 = builtin_examples()
    assert heldout == heldout2 and train == train2
    assert load_dataset("builtin-arith") == (train, heldout)
    assert len(heldout) == HELDOUT_SIZE
    train_q = [e["question"] for e in train]
    held_q = [e["question"] for e in heldout]
    assert len(set(train_q)) == len(train_q) and len(set(held_q)) == len(held_q)
    assert not set(train_q) & set(held_q)


def test_builtin_answers_equal_python_eval_and_solutions_check_out():
    train, heldout = builtin_examples()
    for e in train + heldout:
        q = e["question"]
        assert e["answer"] == str(eval(q)), q
        steps = split_steps(e["solution"])
        assert steps[-1] == f"#### {e['answer']}"
        assert [check_step(s, q, steps[:j]) for j, s in enumerate(steps)] == [True] * len(steps), e


def test_builtin_precedence_share():
    train, heldout = builtin_examples()
    questions = [e["question"] for e in train + heldout]
    share = sum(map(_is_precedence_shape, questions)) / len(questions)
    assert share == pytest.approx(PRECEDENCE_SHARE, abs=1 / len(questions))
    held_share = sum(_is_precedence_shape(e["question"]) for e in heldout) / len(heldout)
    assert held_share == pytest.approx(PRECEDENCE_SHARE, abs=0.1)
    # in those shapes working left to right gives a wrong answer, except when the last operand is 1
    for q in questions:
        if _is_precedence_shape(q) and q[4] != "1":
            a, op1, b, op2, c = int(q[0]), q[1], int(q[2]), q[3], int(q[4])
            assert solve(a, op1, b, op2, c, respect_precedence=False)[1] != eval(q), q


def test_warmup_examples_are_deterministic_and_from_the_training_split():
    first = warmup_examples(300, wrong_share=0.7, seed=3)
    assert first == warmup_examples(300, wrong_share=0.7, seed=3)
    assert first != warmup_examples(300, wrong_share=0.7, seed=4)
    train, heldout = builtin_examples()
    held_q = {e["question"] for e in heldout}
    train_q = {e["question"] for e in train}
    for e in first:
        if len(e["question"]) == 5:  # a full question (the others are one-step drills like "16+4")
            assert e["question"] in train_q and e["question"] not in held_q


def test_warmup_examples_contain_left_to_right_solutions_at_the_configured_share():
    wrong_share, drill_share, n = 0.7, 0.4, 3000
    examples = warmup_examples(n, wrong_share=wrong_share, seed=0, drill_share=drill_share)
    drills = [e for e in examples if len(e["question"]) != 5]
    full = [e for e in examples if len(e["question"]) == 5]
    assert len(drills) / n == pytest.approx(drill_share, abs=0.04)
    for e in drills:  # drills are always right
        assert e["answer"] == str(eval(e["question"]))
    left_to_right = wrong_answers = 0
    precedence = [e for e in full if _is_precedence_shape(e["question"])]
    for e in full:
        q = e["question"]
        first_step = split_steps(e["solution"])[0]
        is_l2r = first_step.startswith(q[:3] + "=") and _is_precedence_shape(q)
        left_to_right += is_l2r
        if e["answer"] != str(eval(q)):
            wrong_answers += 1
            assert is_l2r, e  # every wrong answer comes from working left to right
        assert e["solution"].endswith(f"#### {e['answer']}")
    assert left_to_right / len(precedence) == pytest.approx(wrong_share, abs=0.05)
    assert wrong_answers > 0.5 * left_to_right  # most left-to-right solutions end wrong


def test_warmup_examples_without_wrong_share_are_all_right():
    for e in warmup_examples(300, wrong_share=0.0, seed=1):
        assert e["answer"] == str(eval(e["question"]))


# --- the trainer's token helpers -------------------------------------------------------------

def test_step_boundaries_one_character_per_token():
    # "3*4=12" is chars 0..5, "\n" 6, "2+12=14" 7..13, "\n" 14, "#### 14" 15..21
    steps, ends = step_boundaries(list("3*4=12\n2+12=14\n#### 14"))
    assert steps == ["3*4=12", "2+12=14", "#### 14"]
    assert ends == [5, 13, 21]


def test_step_boundaries_multi_character_tokens():
    # tokens: 0 "3*4", 1 "=12\n2", 2 "+12=14\n", 3 "####", 4 " 14"
    # step 1 ends with "2" of "12" in token 1; step 2 ends with "4" in token 2; step 3 in token 4
    steps, ends = step_boundaries(["3*4", "=12\n2", "+12=14\n", "####", " 14"])
    assert steps == ["3*4=12", "2+12=14", "#### 14"]
    assert ends == [1, 2, 4]


def test_step_boundaries_skip_blank_lines_and_trailing_spaces():
    # chars: 0-1 "\n\n", 2..7 "3*4=12", 8-9 spaces, 10-11 "\n\n", 12..18 "#### 14", 19 "\n"
    steps, ends = step_boundaries(list("\n\n3*4=12  \n\n#### 14\n"))
    assert steps == ["3*4=12", "#### 14"]
    assert ends == [7, 18]
    assert step_boundaries([]) == ([], [])


def test_completion_mask():
    eos = 1
    completions = torch.tensor([
        [5, 6, 1, 0, 0],  # EOS at 2: tokens 0..2 are real
        [5, 1, 1, 0, 0],  # only the first EOS counts
        [5, 6, 7, 8, 9],  # no EOS: truncated, all real
        [1, 0, 0, 0, 0],  # EOS first
    ])
    mask, ended = completion_mask(completions, eos)
    assert mask.tolist() == [
        [1.0, 1.0, 1.0, 0.0, 0.0],
        [1.0, 1.0, 0.0, 0.0, 0.0],
        [1.0, 1.0, 1.0, 1.0, 1.0],
        [1.0, 0.0, 0.0, 0.0, 0.0],
    ]
    assert ended.tolist() == [True, True, False, True]
