"""Pass@k and Maj@k: how DeepSeekMath reads what RL changed (§5.2.2, Figure 7), from K sampled outputs per question.

Each held-out question gets K outputs sampled at ``eval_temperature``. Each output is read once, under the run's
``answer_match`` (rewards.final_answer), into a :class:`Reading`: the answer it states, or None, and whether that
answer is right. Then, for each k in :func:`ks_up_to` (1, 2, 4, ... up to K, and K itself):

- **pass@k**: the chance that at least one of k outputs drawn from the K is right, estimated without bias from the
  count c of right ones among the n = K (Chen et al. 2021, Codex): ``1 - C(n - c, k) / C(n, k)``;
- **maj@k**: whether the answer most of the first k outputs state is right. Outputs stating no answer do not vote;
  answers equal as mathematics (rewards.answers_match: "8" and "8.0") are one answer; a tie goes to the answer
  stated first among the tied ones; with no answer stated at all the vote is wrong.

Each is averaged over the questions. Pure Python: no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from grpo_engine.rewards.rewards import answers_match, final_answer, reading_reward


@dataclass(frozen=True)
class Reading:
    """One sampled output as the verifier read it: the answer it states (None: no answer) and whether it is right."""

    answer: str | None
    correct: bool


def read_outputs(texts: Sequence[str], reference: str, match: str) -> list[Reading]:
    """The readings of one question's outputs under the rule ``match`` (RunSpec.answer_match).

    >>> read_outputs(["#### 8", "it is 7", "no idea"], "8", "flexible")
    [Reading(answer='8', correct=True), Reading(answer='7', correct=False), Reading(answer=None, correct=False)]
    """
    readings = []
    for text in texts:
        answer, form = final_answer(text, match)
        readings.append(Reading(answer, reading_reward((answer, form), reference)[1]["correct"] == 1.0))
    return readings


def ks_up_to(samples: int) -> list[int]:
    """The k a sampled evaluation reports: the powers of two up to K, and K itself.

    >>> ks_up_to(8), ks_up_to(6), ks_up_to(1), ks_up_to(0)
    ([1, 2, 4, 8], [1, 2, 4, 6], [1], [])
    """
    ks, k = [], 1
    while k < samples:
        ks.append(k)
        k *= 2
    return ks + [samples] if samples else []


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from n outputs of which c are right: 1 - C(n - c, k) / C(n, k), computed as
    the product 1 - prod_{i = n - c + 1}^{n} (1 - k / i), which stays exact where the binomials overflow.

    Worked: n 4, c 1: pass@1 = 1 - C(3,1)/C(4,1) = 1 - 3/4 = 0.25, pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5,
    pass@4 = 1 (some right output is always among all four).

    >>> [pass_at_k(4, 1, k) for k in (1, 2, 4)], pass_at_k(4, 0, 4), round(pass_at_k(8, 3, 2), 4)
    ([0.25, 0.5, 1.0], 0.0, 0.6429)
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n {n}, c {c}, k {k}")
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def majority_is_right(readings: Sequence[Reading]) -> bool:
    """Whether the answer most of ``readings`` state is right (ties: the one stated first; no votes: wrong).

    >>> R = Reading
    >>> majority_is_right([R("7", False), R("8", True), R("8.0", True)])  # "8" and "8.0" are one answer
    True
    >>> majority_is_right([R("7", False), R("8", True)]), majority_is_right([R(None, False), R("8", True)])
    (False, True)
    """
    votes: list[list[Reading]] = []  # one list per distinct answer, in the order first stated
    for reading in readings:
        if reading.answer is None:
            continue
        for same in votes:
            if answers_match(reading.answer, same[0].answer):
                same.append(reading)
                break
        else:
            votes.append([reading])
    if not votes:
        return False
    most = max(len(v) for v in votes)
    return next(v for v in votes if len(v) == most)[0].correct


def sampled_scores(questions: Sequence[Sequence[Reading]], samples: int) -> dict[str, float]:
    """eval/pass@k and eval/maj@k for each k of :func:`ks_up_to` (K = ``samples``), averaged over ``questions``
    (each the K readings of one question's outputs).

    Worked: question 1's outputs are right 2 times of 4 (pass@1 0.5, pass@2 1 - 1/6 = 0.833) and mostly say the
    right "8"; question 2's 1 time of 4 (pass@1 0.25, pass@2 0.5) and mostly say a wrong "5":

    >>> R = Reading
    >>> q1 = [R("8", True), R("7", False), R("8", True), R(None, False)]  # 2 right of 4; majority "8"
    >>> q2 = [R("5", False), R("3", True), R("5", False), R("6", False)]  # 1 right of 4; majority "5"
    >>> {name: round(value, 4) for name, value in sampled_scores([q1, q2], 4).items()}
    {'eval/pass@1': 0.375, 'eval/maj@1': 0.5, 'eval/pass@2': 0.6667, 'eval/maj@2': 0.5, 'eval/pass@4': 1.0, 'eval/maj@4': 0.5}
    """
    sums = sampled_sums(questions, samples)
    return {name: total / max(1, len(questions)) for name, total in sums.items()}


def sampled_sums(questions: Sequence[Sequence[Reading]], samples: int) -> dict[str, float]:
    """The per-question values of :func:`sampled_scores` summed (processes that each evaluate a share of the
    questions add their sums, then divide by the number of questions)."""
    sums: dict[str, float] = {}
    for k in ks_up_to(samples):
        sums[f"eval/pass@{k}"] = 0.0
        sums[f"eval/maj@{k}"] = 0.0
    for readings in questions:
        if len(readings) != samples:
            raise ValueError(f"a question has {len(readings)} sampled outputs, not eval_samples {samples}")
        right = sum(r.correct for r in readings)
        for k in ks_up_to(samples):
            sums[f"eval/pass@{k}"] += pass_at_k(samples, right, k)
            sums[f"eval/maj@{k}"] += float(majority_is_right(readings[:k]))
    return sums
