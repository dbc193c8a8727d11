"""The built-in named rewards (run spec ``rewards``), all outcome rewards: one number per output, pure Python.

``accuracy`` is the verifier (1 for a right final answer under the run's ``answer_match``); ``format`` pays a final
answer stated in the strict form, right or wrong; ``length`` and ``repetition`` shape the output's length and
wording (TRL's cosine-scaled and n-gram rewards).

Two more pay the strict form in ways a policy cannot collect without answering, which is what teaches a small
instruct model the answer and not only the form (docs/data-and-rewards.md, "Teaching an instruct model the form"):
``strict_correct`` pays only a right answer stated in the strict form, and ``format_after_working`` pays the strict
form only after some working. ``format`` pays a bare ``#### 7`` too: on SmolLM2-135M-Instruct (seed 0, weight 0.15
beside accuracy and strict_correct) the outputs shrank to that within 20 steps, format 1.00 and flexible accuracy
0.14 -> 0.01, every group of equal rewards from step 35 (docs/real_model.png).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from grpo_engine.rewards.rewards import ANSWER_PREFIX, extract_final_answer, outcome_reward

# length: the cosine schedule's end values (Demystifying Long CoT, Yeo et al. 2025; TRL's get_cosine_scaled_reward)
COSINE_CORRECT = (1.0, 0.5)  # a right answer: reward at length 0, reward at max_new_tokens and beyond
COSINE_WRONG = (-1.0, -0.5)  # a wrong one: the same two ends (longer is penalised less)
CHARS_PER_TOKEN = 4  # length without a token count (the Launch tab's preview): characters / 4
REPETITION_N = 3  # repetition: n-grams of this many words
REPETITION_MAX_PENALTY = 1.0  # repetition: the reward of an output that only repeats one n-gram is about -this
MIN_WORKING_WORDS = 5  # format_after_working: words before the final answer that count as working


def _correct(completion: str, reference: str, row: dict) -> float:
    """The verifier's verdict: ``row["correct"]`` when the engine passes it (judged under the run's answer_match),
    else computed (rewards.outcome_reward) under ``row["answer_match"]`` ('strict' when it is not given)."""
    if row.get("correct") is not None:
        return float(row["correct"])
    return outcome_reward(completion, reference, match=row.get("answer_match") or "strict")[1]["correct"]


def accuracy_reward(question: str, completion: str, reference: str, **row: Any) -> float:
    """1.0 when the output's final answer equals the reference answer (the verifier: rewards.outcome_reward, exact
    numbers or math-verify; the final answer read as ``row["answer_match"]`` says, strict by default), else 0.0.

    >>> accuracy_reward("2+3*4", "3*4=12\\n2+12=14\\n#### 14", "14"), accuracy_reward("q", "#### 15", "14")
    (1.0, 0.0)
    >>> prose = "3 + 5 = 8 apples."
    >>> accuracy_reward("q", prose, "8"), accuracy_reward("q", prose, "8", answer_match="flexible")
    (0.0, 1.0)
    """
    return _correct(completion, reference, row)


def format_reward(question: str, completion: str, reference: str, **row: Any) -> float:
    """1.0 when the output states a final answer in the expected form (a last line ``#### <answer>`` or a
    ``\\boxed{...}``), right or wrong; else 0.0 (rewards.extract_final_answer).

    >>> format_reward("q", "so \\\\boxed{7}", "8"), format_reward("q", "it is 7", "7")
    (1.0, 0.0)
    """
    return float(extract_final_answer(completion)[0] is not None)


def length_reward(question: str, completion: str, reference: str, **row: Any) -> float:
    """Cosine-scaled length reward (Demystifying Long CoT; TRL's get_cosine_scaled_reward): a right answer earns
    more when shorter, a wrong one is penalised less when longer.

        p = min(L / L_max, 1),  r = r_end + 0.5 (r_0 - r_end)(1 + cos(pi p))

    with L the output's length in tokens (``row["completion_tokens"]``; without it, characters / CHARS_PER_TOKEN),
    L_max the run's max_new_tokens (``row["max_new_tokens"]``), (r_0, r_end) = COSINE_CORRECT (1.0, 0.5) for a
    right answer and COSINE_WRONG (-1.0, -0.5) for a wrong one. Worked: right, 8 of 32 tokens: p = 0.25,
    r = 0.5 + 0.25 x (1 + cos(pi/4)) = 0.9268; wrong at 8 of 32: -0.9268; right at 32 of 32: 0.5.

    >>> round(length_reward("q", "#### 14", "14", completion_tokens=8, max_new_tokens=32), 4)
    0.9268
    >>> round(length_reward("q", "#### 15", "14", completion_tokens=8, max_new_tokens=32), 4)
    -0.9268
    """
    tokens = row.get("completion_tokens")
    length = float(tokens) if tokens is not None else len(completion) / CHARS_PER_TOKEN
    progress = min(length / max(float(row.get("max_new_tokens") or 1), 1.0), 1.0)
    start, end = COSINE_CORRECT if _correct(completion, reference, row) else COSINE_WRONG
    return end + 0.5 * (start - end) * (1.0 + math.cos(math.pi * progress))


def repetition_reward(question: str, completion: str, reference: str, **row: Any) -> float:
    """N-gram repetition penalty (TRL's get_repetition_penalty_reward): with the output's lower-cased words cut into
    n-grams of REPETITION_N (3) words, r = -(1 - unique n-grams / all n-grams) x REPETITION_MAX_PENALTY (1.0), in
    (-1, 0]; 0 for an output shorter than n words. Worked: "a b a b a b" has the 3-grams aba, bab, aba, bab:
    2 unique of 4, r = -(1 - 2/4) x 1 = -0.5.

    >>> repetition_reward("q", "a b a b a b", "x"), repetition_reward("q", "one two three four", "x")
    (-0.5, 0.0)
    """
    words = completion.lower().split()
    if len(words) < REPETITION_N:
        return 0.0
    grams = list(zip(*(words[i:] for i in range(REPETITION_N)), strict=False))  # shifted copies: the n-grams
    return -(1.0 - len(set(grams)) / len(grams)) * REPETITION_MAX_PENALTY + 0.0  # + 0.0: no -0.0


def strict_correct_reward(question: str, completion: str, reference: str, **row: Any) -> float:
    """1.0 when the output's final answer, read under the strict rule (a last ``#### N`` line or a ``\\boxed{}``),
    equals the reference; else 0.0, whatever the run's ``answer_match``. Beside ``accuracy`` under ``answer_match:
    flexible`` it pays a right answer in prose 1, the same answer stated after ``####`` 1 + weight, and a wrong
    answer nothing however it is stated: the strict form is worth learning only with a right answer.

    >>> strict_correct_reward("q", "3 + 5 = 8\\n#### 8", "8"), strict_correct_reward("q", "3 + 5 = 8", "8")
    (1.0, 0.0)
    >>> strict_correct_reward("q", "#### 9", "8")
    0.0
    """
    return outcome_reward(completion, reference, match="strict")[1]["correct"]


def format_after_working_reward(question: str, completion: str, reference: str, **row: Any) -> float:
    """1.0 when the output states a final answer in the strict form after at least MIN_WORKING_WORDS (5)
    whitespace-separated words, right or wrong; else 0.0. The words counted are those before the last ``####``
    (or, for a ``\\boxed{}`` answer, before the last ``\\boxed``): "Tom has 3 + 5 = 8 apples." is 7 words, a bare
    ``#### 8`` none, so the form cannot be collected without working.

    >>> format_after_working_reward("q", "Tom has 3 + 5 = 8 apples.\\n#### 8", "8")
    1.0
    >>> format_after_working_reward("q", "#### 8", "8"), format_after_working_reward("q", "Tom has 3 + 5 = 8.", "8")
    (0.0, 0.0)
    """
    if extract_final_answer(completion)[0] is None:
        return 0.0
    marker = ANSWER_PREFIX.strip() if ANSWER_PREFIX.strip() in completion else "\\boxed"
    return float(len(completion.rsplit(marker, 1)[0].split()) >= MIN_WORKING_WORDS)


BUILTINS: dict[str, Callable[..., float]] = {
    "accuracy": accuracy_reward,
    "format": format_reward,
    "length": length_reward,
    "repetition": repetition_reward,
    "strict_correct": strict_correct_reward,
    "format_after_working": format_after_working_reward,
}
