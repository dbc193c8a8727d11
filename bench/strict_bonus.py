"""A bench reward: the format reward paid only with a right answer, so that it cannot be collected alone.

``stated_right`` is 1.0 when the output's final answer, read under the strict rule (a last ``#### N`` line or a
``\\boxed{}``), equals the reference; else 0.0. Beside ``accuracy`` under ``answer_match: flexible`` it pays a right
answer in prose 1.0 and the same answer stated after ``####`` 1.0 + weight, and a wrong answer nothing, however it
is stated. bench/real_model.py uses it with ``--strict-bonus WEIGHT`` (a reward in a file: ``path.py:function``).
"""

from __future__ import annotations

from typing import Any

from grpo_engine.rewards.rewards import outcome_reward


def stated_right(question: str, completion: str, reference: str, **row: Any) -> float:
    """1.0 when the strict final answer is right, else 0.0.

    >>> stated_right("q", "3 + 5 = 8\\n#### 8", "8"), stated_right("q", "3 + 5 = 8", "8")
    (1.0, 0.0)
    >>> stated_right("q", "#### 9", "8")
    0.0
    """
    return outcome_reward(completion, reference, match="strict")[1]["correct"]
