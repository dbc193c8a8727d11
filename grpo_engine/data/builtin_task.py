"""The built-in arithmetic task (``builtin-arith``): its questions, their solutions, its step checker and
the warm-up data of the built-in policy.

In the spirit of the seed article's "2+3x4": three one-digit numbers with two operators, where operator
precedence decides the answer (``2+3*4`` is 14, not 20). An example is ``{"question", "answer",
"solution"}``; a solution has one step per line (``STEP_DELIMITER``) and ends with the line
``#### <answer>``, GSM8K style. The step checker plays the process reward model's part (paper 4.1.3) on
this task. Pure Python: no torch.
"""

from __future__ import annotations

import random
import re
from collections import Counter

from grpo_engine.rewards.rewards import ANSWER_PREFIX, extract_final_answer, plain_number

STEP_DELIMITER = "\n"  # between the steps of a built-in solution; a run's default step delimiter

# Question shapes. In the "precedence" shapes the second operator binds tighter than the first,
# so working left to right gives a wrong answer (unless the last number is 1).
PRECEDENCE_SHAPES = ("{a}+{b}*{c}", "{a}-{b}*{c}")
PLAIN_SHAPES = ("{a}*{b}+{c}", "{a}*{b}-{c}", "{a}+{b}-{c}", "{a}-{b}+{c}", "{a}+{b}+{c}")
PRECEDENCE_SHARE = 0.75  # share of built-in questions of a precedence shape
HELDOUT_SIZE = 200  # the built-in held-out split's size, and the most rows any dataset holds out
DIGITS = range(1, 7)  # operands; small enough for the tiny model to learn every fact in its warm start
BUILTIN_QUESTION = re.compile(r"\d[+*-]\d[+*-]\d")  # what check_step can check: 'a op b op c', one digit each
BUILTIN_SEED = 1234


def _apply(x: int, op: str, y: int) -> int:
    return x + y if op == "+" else x - y if op == "-" else x * y


def solve(a: int, op1: str, b: int, op2: str, c: int, *, respect_precedence: bool = True) -> tuple[list[str], int]:
    """Step-by-step evaluation of ``a op1 b op2 c``; returns (steps, answer).

    With ``respect_precedence=False`` it works strictly left to right (the classic slip).
    >>> solve(2, "+", 3, "*", 4)
    (['3*4=12', '2+12=14'], 14)
    >>> solve(2, "+", 3, "*", 4, respect_precedence=False)
    (['2+3=5', '5*4=20'], 20)
    """
    if respect_precedence and op2 == "*" and op1 != "*":
        inner = b * c
        result = _apply(a, op1, inner)
        return [f"{b}*{c}={inner}", f"{a}{op1}{inner}={result}"], result
    first = _apply(a, op1, b)
    result = _apply(first, op2, c)
    return [f"{a}{op1}{b}={first}", f"{first}{op2}{c}={result}"], result


def format_solution(steps: list[str], answer: int | str) -> str:
    """Steps joined by the step delimiter, then the final answer line.

    >>> format_solution(['3*4=12', '2+12=14'], 14)
    '3*4=12\\n2+12=14\\n#### 14'
    """
    return STEP_DELIMITER.join([*steps, f"{ANSWER_PREFIX}{answer}"])


def _builtin_questions() -> list[tuple[int, str, int, str, int]]:
    """All built-in questions, in a fixed shuffled order, with the precedence share applied."""
    rng = random.Random(BUILTIN_SEED)
    digits = DIGITS

    def expand(shapes):
        out = []
        for shape in shapes:
            op1, op2 = shape[3], shape[7]
            out += [(a, op1, b, op2, c) for a in digits for b in digits for c in digits]
        return out

    precedence, plain = expand(PRECEDENCE_SHAPES), expand(PLAIN_SHAPES)
    rng.shuffle(precedence)
    rng.shuffle(plain)
    n_plain = round(len(precedence) * (1 - PRECEDENCE_SHARE) / PRECEDENCE_SHARE)
    questions = precedence + plain[:n_plain]
    rng.shuffle(questions)
    return questions


def builtin_examples() -> tuple[list[dict], list[dict]]:
    """The built-in dataset as (train, heldout); the held-out split is fixed.

    Held-out questions are new questions, but every arithmetic step of their solutions also occurs
    in some training question's solution: evaluation measures whether the policy learned to respect
    precedence, not whether it can guess a product it never saw.
    """
    examples = []
    for a, op1, b, op2, c in _builtin_questions():
        steps, answer = solve(a, op1, b, op2, c)
        examples.append(
            {
                "question": f"{a}{op1}{b}{op2}{c}",
                "answer": str(answer),
                "solution": format_solution(steps, answer),
                "steps": steps,
            }
        )
    uses = Counter(step for ex in examples for step in ex["steps"])
    train, heldout = [], []
    for ex in examples:  # already in a fixed shuffled order
        if len(heldout) < HELDOUT_SIZE and all(uses[step] > 1 for step in ex["steps"]):
            heldout.append(ex)
            uses.subtract(ex["steps"])  # the remaining training questions must still cover its steps
        else:
            train.append(ex)
    strip = lambda rows: [{k: v for k, v in ex.items() if k != "steps"} for ex in rows]  # noqa: E731
    return strip(train), strip(heldout)


def check_step(step: str, question: str, previous: list[str]) -> bool:
    """Is this step of a built-in solution right?

    A step ``x op y = z`` is right when its arithmetic is right and it is the operation that
    operator precedence says comes next, given the steps before it. The step after the last one is
    the final answer line: a ``#### <answer>`` line, read as the verifier reads it
    (:func:`extract_final_answer`), whose answer is a plain number (:func:`plain_number`) equal to the
    question's. So ``#### 14.0`` states 14; ``#### 28/2`` and ``\\boxed{14}`` state no number.
    >>> check_step("3*4=12", "2+3*4", [])
    True
    >>> check_step("2+3=5", "2+3*4", [])
    False
    >>> check_step("#### 14", "2+3*4", ["3*4=12", "2+12=14"])
    True
    >>> check_step("3*4=12", "hello", [])  # not a built-in question: no steps to check against
    False
    """
    q = question
    if not BUILTIN_QUESTION.fullmatch(q):  # not one of the built-in task's questions: nothing to check against
        return False
    reference_steps, answer = solve(int(q[0]), q[1], int(q[2]), q[3], int(q[4]))
    k = len(previous)
    if k < len(reference_steps):
        return step.strip() == reference_steps[k]
    if k == len(reference_steps):
        got, form = extract_final_answer(step)
        return form == "gsm8k" and plain_number(got) == answer
    return False


# ---- the built-in policy's warm-up data ---------------------------------------------------------


def arithmetic_facts() -> list[str]:
    """Every one-operation step (``16+4=20``) that a solution of any question of the built-in task's
    shapes can use, either way round: the arithmetic a solver must know (no question is given away)."""
    facts = set()
    for shape in PRECEDENCE_SHAPES + PLAIN_SHAPES:
        op1, op2 = shape[3], shape[7]
        for a in DIGITS:
            for b in DIGITS:
                for c in DIGITS:
                    for keep_precedence in (True, False):
                        facts.update(solve(a, op1, b, op2, c, respect_precedence=keep_precedence)[0])
    return sorted(facts)


def warmup_examples(n: int, wrong_share: float, seed: int, drill_share: float = 0.4) -> list[dict]:
    """Supervised warm-start data for the built-in policy: a deliberately imperfect mix.

    On precedence questions a ``wrong_share`` of the solutions work left to right, so the warm-started
    model often ignores precedence and GRPO has something to fix. A ``drill_share`` of one-step
    questions (``16+4``) teaches the arithmetic itself. Drawn from the training split only.
    """
    rng = random.Random(seed)
    train, _ = builtin_examples()
    facts = arithmetic_facts()
    out = []
    for _ in range(n):
        if rng.random() < drill_share:  # a one-step question: "16+4" -> "16+4=20\n#### 20"
            fact = rng.choice(facts)
            expr, z = fact.split("=")
            out.append({"question": expr, "answer": z, "solution": format_solution([fact], z)})
            continue
        q = rng.choice(train)["question"]
        a, op1, b, op2, c = int(q[0]), q[1], int(q[2]), q[3], int(q[4])
        steps, answer = solve(a, op1, b, op2, c, respect_precedence=rng.random() >= wrong_share)
        out.append({"question": q, "answer": str(answer), "solution": format_solution(steps, answer)})
    return out
