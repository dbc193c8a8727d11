"""The built-in word problems (``builtin-word-problems``): easy GSM8K-style questions, generated, one or two
operations on small whole numbers, each row with its answer and a worked solution (the steps with ``<<a+b=c>>``
annotations, then ``#### <answer>``).

    rows = word_problems(600, seed=0)   # [{"question", "answer", "solution"}, ...], no question twice

Kinds (the share of each is equal):
- one operation: a + b (buys more), a - b (gives away), a x b (bags of b), a / b (shared equally, exact);
- two operations: a + b - c, a x b + c, (a + b) x c.

The built-in set (:func:`builtin_word_problems`) is always the same WORD_ROWS questions (seed WORD_SEED, every number
drawn at most WORD_MAX_NUMBER: single digits), its last tenth held out: the dataset of the preset "Small instruct
model on word problems (CPU)", where a 135M instruct model starts near 0.14 (flexible) and learns within 40 steps.
"""

from __future__ import annotations

import random
import re  # noqa: F401  (the doctest reads the questions' numbers)

NAMES = ("Tom", "Anna", "Lena", "Omar", "Priya", "Jack", "Mia", "Kofi", "Sara", "Luis", "Yuki", "Ben")
ITEMS = ("apples", "stickers", "marbles", "pencils", "cookies", "books", "stamps", "shells", "cards", "toy cars")


def _add(r, name, item, cap):
    a, b = r.randint(2, cap(40)), r.randint(2, cap(40))
    return (
        f"{name} has {a} {item}. {name} buys {b} more {item}. How many {item} does {name} have now?",
        [f"{name} has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} {item} now."],
        a + b,
    )


def _subtract(r, name, item, cap):
    a = r.randint(min(10, cap(60) // 3), cap(60))
    b = r.randint(2, a - 1)
    return (
        f"{name} had {a} {item} and gave {b} of them to a friend. How many {item} does {name} have left?",
        [f"{name} has {a} - {b} = <<{a}-{b}={a - b}>>{a - b} {item} left."],
        a - b,
    )


def _multiply(r, name, item, cap):
    a, b = r.randint(2, cap(9)), r.randint(2, cap(12))
    return (
        f"{name} buys {a} bags of {item}. Each bag holds {b} {item}. How many {item} does {name} buy?",
        [f"{name} buys {a} * {b} = <<{a}*{b}={a * b}>>{a * b} {item}."],
        a * b,
    )


def _divide(r, name, item, cap):
    b, each = r.randint(2, cap(8)), r.randint(2, cap(10))
    a = b * each
    return (
        f"{name} shares {a} {item} equally among {b} friends. How many {item} does each friend get?",
        [f"Each friend gets {a} / {b} = <<{a}/{b}={each}>>{each} {item}."],
        each,
    )


def _add_subtract(r, name, item, cap):
    a, b = r.randint(5, cap(40)), r.randint(2, cap(30))
    c = r.randint(2, cap(a + b - 1))
    return (
        f"{name} has {a} {item}, buys {b} more and then gives {c} away. How many {item} does {name} have now?",
        [
            f"After buying, {name} has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} {item}.",
            f"After giving some away, {name} has {a + b} - {c} = <<{a + b}-{c}={a + b - c}>>{a + b - c} {item}.",
        ],
        a + b - c,
    )


def _multiply_add(r, name, item, cap):
    a, b, c = r.randint(2, cap(6)), r.randint(2, cap(10)), r.randint(1, cap(20))
    return (
        f"{name} already has {c} {item} and buys {a} packs of {b} {item}. How many {item} does {name} have now?",
        [
            f"The packs hold {a} * {b} = <<{a}*{b}={a * b}>>{a * b} {item}.",
            f"{name} has {a * b} + {c} = <<{a * b}+{c}={a * b + c}>>{a * b + c} {item} now.",
        ],
        a * b + c,
    )


def _add_multiply(r, name, item, cap):
    a, b, c = r.randint(1, cap(9)), r.randint(1, cap(9)), r.randint(2, cap(5))
    return (
        f"A box holds {a} red {item} and {b} blue {item}. How many {item} are in {c} such boxes?",
        [
            f"One box holds {a} + {b} = <<{a}+{b}={a + b}>>{a + b} {item}.",
            f"{c} boxes hold {a + b} * {c} = <<{a + b}*{c}={(a + b) * c}>>{(a + b) * c} {item}.",
        ],
        (a + b) * c,
    )


KINDS = (_add, _subtract, _multiply, _divide, _add_subtract, _multiply_add, _add_multiply)
TWO_OPERATIONS = KINDS[4:]  # the kinds of two operations
WORD_ROWS = 1100  # the built-in set's questions: the first 990 train, the last 110 are held out
WORD_SEED = 1234  # the built-in set's seed
WORD_MAX_NUMBER = 9  # the built-in set's numbers: single digits


def word_problems(n: int, seed: int = 0, max_number: int | None = None, kinds=KINDS) -> list[dict]:
    """``n`` distinct problems, ``kinds`` in turn (all by default; TWO_OPERATIONS: the two-operation ones), numbers
    and wording drawn from ``seed``. ``max_number`` caps every number drawn for a question (9: single digits; the
    totals and a shared amount may be larger); ``None`` draws from each kind's own ranges (up to 60).

    >>> row = word_problems(1)[0]
    >>> row["solution"].endswith("#### " + row["answer"]) and row["question"].endswith("?")
    True
    >>> all(int(n) <= 9 for row in word_problems(70, max_number=9) if "shares" not in row["question"]
    ...     for n in re.findall(r"[0-9]+", row["question"]))
    True
    """
    r, rows, seen = random.Random(seed), [], set()
    cap = (lambda hi: hi) if max_number is None else (lambda hi: min(hi, max_number))
    while len(rows) < n:
        kind = kinds[len(rows) % len(kinds)]
        question, steps, answer = kind(r, r.choice(NAMES), r.choice(ITEMS), cap)
        if question in seen:
            continue
        seen.add(question)
        rows.append({"question": question, "answer": str(answer), "solution": "\n".join(steps) + f"\n#### {answer}"})
    return rows


def builtin_word_problems() -> tuple[list[dict], list[dict]]:
    """The built-in set as (train, heldout): WORD_ROWS questions, the last tenth held out.

    >>> train, heldout = builtin_word_problems()
    >>> len(train), len(heldout), heldout[0]["solution"].endswith("#### " + heldout[0]["answer"])
    (990, 110, True)
    """
    rows = word_problems(WORD_ROWS, seed=WORD_SEED, max_number=WORD_MAX_NUMBER)
    held = WORD_ROWS // 10
    return rows[:-held], rows[-held:]
