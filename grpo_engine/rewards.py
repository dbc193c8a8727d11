"""Rule-based rewards: small pure functions returning ``(total, components)``.

The verifier plays the outcome reward model's part (paper 4.1.2): it knows the reference answer.
The step checker plays the process reward model's part (4.1.3) on the built-in task.
"""
from __future__ import annotations

import re

from .data import ANSWER_PREFIX, STEP_DELIMITER

_ANSWER_RE = re.compile(re.escape(ANSWER_PREFIX.strip()) + r"\s*(-?\d+(?:\.\d+)?)\s*$")
_STEP_RE = re.compile(r"^(-?\d+)([+\-*])(-?\d+)=(-?\d+)$")


def extract_answer(completion: str) -> str | None:
    """The number on the final ``#### N`` line, or None if the output has no such line."""
    for line in reversed(completion.strip().split(STEP_DELIMITER)):
        match = _ANSWER_RE.match(line.strip())
        if match:
            return match.group(1)
        if line.strip():
            return None
    return None


def _same_number(a: str, b: str) -> bool:
    try:
        return float(a) == float(b)
    except ValueError:
        return a.strip() == b.strip()


def outcome_reward(completion: str, reference_answer: str) -> tuple[float, dict[str, float]]:
    """1.0 when the final answer equals the reference, else 0.0.

    Components: ``correct`` (the answer matches) and ``formatted`` (a final answer line was found).
    """
    answer = extract_answer(completion)
    correct = float(answer is not None and _same_number(answer, reference_answer))
    return correct, {"correct": correct, "formatted": float(answer is not None)}


def check_step(step: str, question: str, previous: list[str]) -> bool:
    """Is this step of a built-in solution right?

    A step ``x op y = z`` is right when its arithmetic is right and it is the operation that
    operator precedence says comes next, given the steps before it; the final line must state the
    last step's result.
    """
    from .data import solve  # the reference order of operations

    q = question
    if len(q) != 5:
        return False
    reference_steps, answer = solve(int(q[0]), q[1], int(q[2]), q[3], int(q[4]))
    k = len(previous)
    if k < len(reference_steps):
        return step.strip() == reference_steps[k]
    if k == len(reference_steps):
        got = extract_answer(step)
        return got is not None and _same_number(got, str(answer))
    return False


def split_steps(completion: str) -> list[str]:
    """The completion's reasoning steps (lines), without empty ones."""
    return [s for s in completion.split(STEP_DELIMITER) if s.strip()]
