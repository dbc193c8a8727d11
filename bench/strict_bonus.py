"""Bench rewards for the form of a final answer (bench/real_model.py; a reward in a file: ``path.py:function``).

``stated_right`` is the format reward paid only with a right answer, so that it cannot be collected alone: 1.0 when the
output's final answer, read under the strict rule (a last ``#### N`` line or a ``\\boxed{}``), equals the reference;
else 0.0. Beside ``accuracy`` under ``answer_match: flexible`` it pays a right answer in prose 1.0 and the same answer
stated after ``####`` 1.0 + weight, and a wrong answer nothing, however it is stated (``--strict-bonus WEIGHT``).

``stated_after_working`` is the format reward paid whatever the answer, but only after some working: 1.0 when the
output states a final answer in the strict form and at least MIN_WORKING_WORDS words come before it. The built-in
``format`` reward pays a bare ``#### 7`` too, which a policy can collect without reasoning: on SmolLM2 (seed 0) the
outputs shrank to that within 20 steps and accuracy fell (``--format-reward W``).
"""

from __future__ import annotations

from typing import Any

from grpo_engine.rewards.rewards import extract_final_answer, outcome_reward

MIN_WORKING_WORDS = 5  # words before the final answer that count as working: "3 + 5 = 8 apples." is 6


def stated_right(question: str, completion: str, reference: str, **row: Any) -> float:
    """1.0 when the strict final answer is right, else 0.0.

    >>> stated_right("q", "3 + 5 = 8\\n#### 8", "8"), stated_right("q", "3 + 5 = 8", "8")
    (1.0, 0.0)
    >>> stated_right("q", "#### 9", "8")
    0.0
    """
    return outcome_reward(completion, reference, match="strict")[1]["correct"]


def stated_after_working(question: str, completion: str, reference: str, **row: Any) -> float:
    """1.0 when a final answer is stated in the strict form after at least MIN_WORKING_WORDS words, right or wrong.

    >>> stated_after_working("q", "Tom has 3 + 5 = 8 apples.\\n#### 8", "8"), stated_after_working("q", "#### 8", "8")
    (1.0, 0.0)
    >>> stated_after_working("q", "Tom has 3 + 5 = 8 apples.", "8")
    0.0
    """
    if extract_final_answer(completion)[0] is None:
        return 0.0
    before = completion.rsplit("####", 1)[0] if "####" in completion else completion.rsplit("\\boxed", 1)[0]
    return float(len(before.split()) >= MIN_WORKING_WORDS)
