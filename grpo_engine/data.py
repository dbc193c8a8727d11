"""Datasets: the built-in arithmetic task, and local JSONL files.

Every example is a dict ``{"question", "answer", "solution"}``: the prompt text, the reference
answer (a string) and a step-by-step reference solution (steps separated by ``STEP_DELIMITER``,
the last line ``#### <answer>``, GSM8K style).

The built-in task is in the spirit of the seed article's "2+3x4": three one-digit numbers with two
operators, where operator precedence decides the answer (``2+3*4`` is 14, not 20). Pure Python.
"""
from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

from .config import BUILTIN_DATASET

STEP_DELIMITER = "\n"
ANSWER_PREFIX = "#### "

# Question shapes. In the "precedence" shapes the second operator binds tighter than the first,
# so working left to right gives a wrong answer (unless the last number is 1).
PRECEDENCE_SHAPES = ("{a}+{b}*{c}", "{a}-{b}*{c}")
PLAIN_SHAPES = ("{a}*{b}+{c}", "{a}*{b}-{c}", "{a}+{b}-{c}", "{a}-{b}+{c}", "{a}+{b}+{c}")
PRECEDENCE_SHARE = 0.75  # share of built-in questions of a precedence shape
HELDOUT_SIZE = 200
DIGITS = range(1, 7)  # operands; small enough for the tiny model to learn every fact in its warm start
BUILTIN_SEED = 1234


def _apply(x: int, op: str, y: int) -> int:
    return x + y if op == "+" else x - y if op == "-" else x * y


def solve(a: int, op1: str, b: int, op2: str, c: int, respect_precedence: bool = True) -> tuple[list[str], int]:
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
    """Steps joined by the step delimiter, then the final answer line."""
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
        examples.append({
            "question": f"{a}{op1}{b}{op2}{c}",
            "answer": str(answer),
            "solution": format_solution(steps, answer),
            "steps": steps,
        })
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
                        facts.update(solve(a, op1, b, op2, c, keep_precedence)[0])
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


def load_dataset(name: str) -> tuple[list[dict], list[dict]]:
    """Load ``name`` as (train, heldout) example lists.

    ``builtin-arith``: the built-in task. A local ``.jsonl`` file: one JSON object per line with
    ``question`` and ``answer`` (and optionally ``solution``); its last 10% (at most 200) is held out.
    """
    if name == BUILTIN_DATASET:
        return builtin_examples()
    path = Path(name).expanduser()
    if path.suffix == ".jsonl" and path.is_file():
        rows = []
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}: line {lineno} is not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict) or "question" not in row or "answer" not in row:
                raise ValueError(f"{path}: line {lineno} needs the fields 'question' and 'answer'")
            rows.append({"question": str(row["question"]), "answer": str(row["answer"]),
                         "solution": str(row.get("solution", ""))})
        if len(rows) < 2:
            raise ValueError(f"{path}: needs at least 2 rows, found {len(rows)}")
        n_held = max(1, min(HELDOUT_SIZE, len(rows) // 10))
        return rows[:-n_held], rows[-n_held:]
    raise ValueError(
        f"dataset {name!r} not found: use '{BUILTIN_DATASET}' or a local .jsonl file "
        "(Hugging Face dataset ids and CSV/Parquet files are not supported in this version)"
    )


def format_prompt(question: str) -> str:
    """The plain prompt template: the question on its own line; the model continues with its steps."""
    return f"{question}\n"
