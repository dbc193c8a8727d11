"""Pass@k and Maj@k (grpo_engine.rewards.sampled_eval) on hand numbers: the unbiased estimator against counting every
k-subset of the outputs, the vote's ties, equal answers and outputs that state none, and the readings under both
answer rules."""

from __future__ import annotations

import itertools
import math

import pytest

from grpo_engine.rewards.sampled_eval import (
    Reading,
    ks_up_to,
    majority_is_right,
    pass_at_k,
    read_outputs,
    sampled_scores,
    sampled_sums,
)

R = Reading


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_at_k_is_the_share_of_k_subsets_holding_a_right_output(n):
    for c in range(n + 1):
        outputs = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(outputs, k))
            assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets), abs=1e-12)


def test_pass_at_k_by_hand_and_where_the_binomials_are_huge():
    assert pass_at_k(4, 1, 1) == 0.25 and pass_at_k(4, 1, 2) == 0.5 and pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(10, 0, 5) == 0.0 and pass_at_k(10, 10, 1) == 1.0
    assert pass_at_k(1000, 1, 500) == pytest.approx(0.5)  # C(1000, 500) overflows a float; the product does not
    assert pass_at_k(1000, 3, 10) == pytest.approx(1 - math.comb(997, 10) / math.comb(1000, 10))
    for bad in [(4, 5, 1), (4, 1, 0), (4, 1, 5), (4, -1, 1)]:
        with pytest.raises(ValueError, match="pass@k"):
            pass_at_k(*bad)


def test_the_vote_counts_equal_answers_as_one_and_breaks_ties_by_the_first_stated():
    assert majority_is_right([R("7", False), R("8", True), R("8.0", True)])  # "8" and "8.0" are one answer
    assert not majority_is_right([R("7", False), R("8", True)])  # tie: "7" was stated first
    assert majority_is_right([R("8", True), R("7", False)])
    assert majority_is_right([R("1/2", True), R("0.5", True), R("3", False)])  # equal as mathematics
    assert not majority_is_right([R("3", False), R("3", False), R("8", True)])


def test_outputs_stating_no_answer_do_not_vote():
    assert majority_is_right([R(None, False), R(None, False), R("8", True)])
    assert not majority_is_right([R(None, False), R(None, False)])  # no vote at all: wrong
    assert not majority_is_right([])


def test_ks_are_the_powers_of_two_up_to_k_and_k():
    assert ks_up_to(16) == [1, 2, 4, 8, 16] and ks_up_to(12) == [1, 2, 4, 8, 12] and ks_up_to(2) == [1, 2]


def test_scores_average_the_questions_and_sums_add_across_processes():
    q1 = [R("8", True), R("7", False), R("8", True), R(None, False)]
    q2 = [R("5", False), R("3", True), R("5", False), R("6", False)]
    scores = sampled_scores([q1, q2], 4)
    assert scores["eval/pass@1"] == 0.375 and scores["eval/pass@2"] == pytest.approx((5 / 6 + 1 / 2) / 2)
    assert scores["eval/pass@4"] == 1.0 and scores["eval/maj@1"] == scores["eval/maj@4"] == 0.5
    # two processes, each with one question: their sums added, over both questions, give the same shares
    added = {k: (sampled_sums([q1], 4)[k] + sampled_sums([q2], 4)[k]) / 2 for k in scores}
    assert added == pytest.approx(scores)
    assert sampled_scores([], 4) == {k: 0.0 for k in scores}
    with pytest.raises(ValueError, match="eval_samples 4"):
        sampled_scores([q1[:3]], 4)


def test_maj_at_k_rises_where_pass_at_1_stays():
    """Figure 7's reading: a model that states the right answer most often but not always gains from the vote."""
    question = [R("8", True), R("9", False), R("8", True), R("7", False), R("8", True), R("6", False)] * 2
    scores = sampled_scores([question], 12)
    assert scores["eval/pass@1"] == 0.5 and scores["eval/maj@12"] == 1.0 and scores["eval/maj@2"] == 1.0


def test_readings_follow_the_runs_answer_rule():
    texts = ["so 3 + 5 = 8 apples", "3 + 5 = 8\n#### 8", "#### 9", "nothing"]
    assert read_outputs(texts, "8", "strict") == [R(None, False), R("8", True), R("9", False), R(None, False)]
    assert read_outputs(texts, "8", "flexible") == [R("8", True), R("8", True), R("9", False), R(None, False)]
    assert read_outputs(["#### 8"], "4 + 4 = 8\n#### 8", "strict") == [R("8", True)]  # a whole solution as reference
