"""Datasets: the built-in arithmetic task, and local JSONL, CSV and Parquet files.

Every example is a dict ``{"question", "answer", "solution"}``: the prompt text, the reference
answer (a string) and a step-by-step reference solution (steps separated by ``STEP_DELIMITER``,
the last line ``#### <answer>``, GSM8K style).

A dataset file is read by :func:`read_dataset_file` (pure Python and pyarrow, no torch), which the
web process also calls at launch and on upload, so a bad file is refused with the file and the line
named before any worker sees it.

The built-in task is in the spirit of the seed article's "2+3x4": three one-digit numbers with two
operators, where operator precedence decides the answer (``2+3*4`` is 14, not 20). Pure Python.
"""
from __future__ import annotations

import csv
import io
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
DATASET_SUFFIXES = (".jsonl", ".csv", ".parquet")  # the dataset files read_dataset_file reads
MIN_ROWS = 2  # a dataset file needs a training row and a held-out row
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


# ---- dataset files ----------------------------------------------------------------------------


def _text(data: bytes, name: str) -> str:
    """The file's bytes as text (UTF-8, a BOM allowed), or a ValueError naming the line of the first bad byte."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ValueError(f"{name}: line {line} is not UTF-8 text (a binary file?)") from None
    if "\x00" in text:
        line = text.count("\n", 0, text.index("\x00")) + 1
        raise ValueError(f"{name}: line {line} holds a NUL byte: a binary file, not text")
    return text


FIELDS = ("question", "answer", "solution")  # an example's keys; a dataset's own column names map onto them


def _example(row: dict, where: str, name: str, fields: tuple[str, str, str] = FIELDS) -> dict:
    """One example from a row that has the columns ``fields`` (question, answer and maybe solution; by
    default named so), as ``{"question", "answer", "solution"}``.

    Text or numbers are accepted (an answer is often written as a number); an empty or missing value of
    the question or answer column is refused, naming ``where`` ("line 3", "row 3") and the column.
    """
    example = {}
    for key, column in zip(FIELDS, fields):
        value = row.get(column)
        if value is None or value != value:  # missing, null, or NaN (an empty Parquet cell)
            value = ""
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise ValueError(f"{name}: {where}: '{column}' must be text or a number, got {type(value).__name__}")
        example[key] = str(value)
        if key != "solution" and not example[key].strip():
            raise ValueError(f"{name}: {where} has an empty '{column}'")
    return example


def _read_jsonl(data: bytes, name: str, fields: tuple[str, str, str] = FIELDS) -> list[dict]:
    """One JSON object per line; blank lines are skipped."""
    rows = []
    for lineno, line in enumerate(_text(data, name).split("\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, an over-long integer, too deep a nesting
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc).split(":")[0]
            raise ValueError(f"{name}: line {lineno} is not valid JSON ({reason})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{name}: line {lineno} is not a JSON object (it is a {type(row).__name__})")
        if fields[0] not in row or fields[1] not in row:
            raise ValueError(f"{name}: line {lineno} needs the fields '{fields[0]}' and '{fields[1]}'")
        rows.append(_example(row, f"line {lineno}", name, fields))
    return rows


def _missing_columns(columns: list[str], name: str, fields: tuple[str, str, str] = FIELDS) -> None:
    missing = [k for k in fields[:2] if k not in columns]
    if missing:
        raise ValueError(f"{name}: needs the columns '{fields[0]}' and '{fields[1]}'; missing {', '.join(map(repr, missing))} "
                         f"(found: {', '.join(map(repr, columns)) or 'none'})")


def _read_csv(data: bytes, name: str, fields: tuple[str, str, str] = FIELDS) -> list[dict]:
    """A header line naming the columns, then one row per line (quoted fields may span lines; a row's line is
    the one it ends on)."""
    reader = csv.DictReader(io.StringIO(_text(data, name), newline=""), strict=True)
    rows = []
    try:
        columns = [c.strip() for c in reader.fieldnames or []]
        reader.fieldnames = columns
        _missing_columns(columns, name, fields)
        for row in reader:
            n_fields = len(columns) + len(row.get(None) or []) - sum(v is None for v in row.values())
            if n_fields != len(columns):
                raise ValueError(f"{name}: line {reader.reader.line_num} has {n_fields} field{'s' if n_fields != 1 else ''}, "
                                 f"the header has {len(columns)}")
            if not any(row.values()):  # a line of empty fields (",,")
                continue
            rows.append(_example(row, f"line {reader.reader.line_num}", name, fields))
    except csv.Error as exc:
        raise ValueError(f"{name}: line {reader.reader.line_num} is not valid CSV ({exc})") from None
    return rows


def _read_parquet(data: bytes, name: str, fields: tuple[str, str, str] = FIELDS) -> list[dict]:
    """A Parquet table with the columns 'question' and 'answer' (and maybe 'solution'); rows count from 1."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(pa.BufferReader(data))
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise ValueError(f"{name}: not a valid Parquet file ({str(exc).splitlines()[0]})") from None
    _missing_columns(table.column_names, name, fields)
    columns = {k: table.column(k).to_pylist() for k in fields if k in table.column_names}
    return [_example({k: v[i] for k, v in columns.items()}, f"row {i + 1}", name, fields) for i in range(table.num_rows)]


READERS = {".jsonl": _read_jsonl, ".csv": _read_csv, ".parquet": _read_parquet}


def read_dataset_file(path: str | Path, name: str | None = None, fields: tuple[str, str, str] = FIELDS) -> list[dict]:
    """The rows ``{"question", "answer", "solution"}`` of a .jsonl, .csv or .parquet file, read from its
    columns ``fields`` (the question's, the answer's and the optional solution's; by default so named).

    ``question`` and ``answer`` are required and not empty, ``solution`` is optional. Anything wrong is a
    ValueError starting with ``name`` (default: the path) and, where there is one, the line or row:
    an unsupported extension, a missing, unreadable, empty or binary file, invalid JSON or CSV, a line that
    is not an object, a missing or empty field, fewer than ``MIN_ROWS`` rows.
    """
    path = Path(path).expanduser()
    name = name or str(path)
    reader = READERS.get(path.suffix.lower())
    if reader is None:
        raise ValueError(f"{name}: unsupported file type {path.suffix or '(no extension)'!r}; "
                         f"a dataset file is {', '.join(DATASET_SUFFIXES)}")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"{name}: no such file") from None
    except OSError as exc:
        raise ValueError(f"{name}: cannot read it ({exc.strerror or exc})") from None
    if not data.strip():
        raise ValueError(f"{name}: the file is empty")
    rows = reader(data, name, fields)
    if len(rows) < MIN_ROWS:
        raise ValueError(f"{name}: needs at least {MIN_ROWS} rows, found {len(rows)}")
    return rows


def _split_off_heldout(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(train, heldout): the last 10% of the rows (at least 1, at most HELDOUT_SIZE) are held out."""
    n_held = max(1, min(HELDOUT_SIZE, len(rows) // 10))
    return rows[:-n_held], rows[-n_held:]


def load_hub_split(name: str, config: str, split: str, what: str = "dataset"):
    """One split of a Hugging Face dataset (a hub id, or a local dataset directory), through the
    ``datasets`` library; one that cannot be loaded (unreachable hub, unknown id, config or split) is a
    ValueError naming ``what`` and saying why, in one line."""
    import datasets

    try:
        return datasets.load_dataset(name, config or None, split=split)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"{what} {name!r} (config {config or 'default'!r}, split {split!r}) could not be loaded: "
                         f"{first[:300]}") from None


def _hub_rows(name: str, config: str, split: str, fields: tuple[str, str, str]) -> list[dict]:
    """The rows of one split of a Hugging Face dataset, read from the columns ``fields``."""
    table = load_hub_split(name, config, split)
    missing = [k for k in fields[:2] if k not in table.column_names]
    if missing:
        raise ValueError(f"dataset {name!r}: no column {', '.join(map(repr, missing))} (its columns: "
                         f"{', '.join(map(repr, table.column_names))}); set question_field / answer_field")
    return [_example(row, f"row {i + 1} of split {split!r}", name, fields) for i, row in enumerate(table)]


def load_dataset(name: str, *, config: str = "", split: str = "train", eval_split: str = "",
                 fields: tuple[str, str, str] = FIELDS) -> tuple[list[dict], list[dict]]:
    """Load ``name`` as (train, heldout) example lists ``{"question", "answer", "solution"}``.

    - ``builtin-arith``: the built-in task (its own fixed held-out split).
    - a local ``.jsonl``, ``.csv`` or ``.parquet`` file (:func:`read_dataset_file`), read from the columns
      ``fields``: its last 10% (at least 1, at most 200) is held out.
    - otherwise a Hugging Face dataset: a hub id such as ``openai/gsm8k`` (config ``main``) or a local
      dataset directory, loaded with ``datasets``: ``split`` trains; ``eval_split`` (when given) is held
      out, else the last 10% of ``split``, as for files.
    """
    if name == BUILTIN_DATASET:
        return builtin_examples()
    path = Path(name).expanduser()
    if path.suffix.lower() in DATASET_SUFFIXES and path.is_file():
        return _split_off_heldout(read_dataset_file(path, fields=fields))
    if path.suffix.lower() in DATASET_SUFFIXES:
        raise ValueError(f"dataset {name!r}: no such file")
    rows = _hub_rows(name, config, split, fields)
    if eval_split:
        heldout = _hub_rows(name, config, eval_split, fields)[:HELDOUT_SIZE]
        if len(rows) < 1 or not heldout:
            raise ValueError(f"dataset {name!r}: needs at least 1 row in split {split!r} and in {eval_split!r}")
        return rows, heldout
    if len(rows) < MIN_ROWS:
        raise ValueError(f"dataset {name!r}: needs at least {MIN_ROWS} rows in split {split!r}, found {len(rows)}")
    return _split_off_heldout(rows)


def format_prompt(question: str) -> str:
    """The plain prompt template: the question on its own line; the model continues with its steps."""
    return f"{question}\n"
