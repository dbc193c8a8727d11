"""Datasets: loading a run's questions from the built-in task, local JSONL, CSV and Parquet files, or
Hugging Face datasets; and the plain prompt template.

Every example is a dict ``{"question", "answer", "solution"}``: the prompt text, the reference
answer (a string) and an optional step-by-step reference solution (GSM8K style: the steps, then the
line ``#### <answer>``).

A dataset file is read by :func:`read_dataset_file` (pure Python and pyarrow, no torch), which the
web process also calls at launch and on upload, so a bad file is refused with the file and the line
named before any worker sees it. Its JSONL reader, :func:`iter_jsonl`, also reads the PRM's
Math-Shepherd files, with the same messages. The built-in task's examples come from builtin_task.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from grpo_engine.data.builtin_task import HELDOUT_SIZE, builtin_examples
from grpo_engine.data.word_problems import builtin_word_problems
from grpo_engine.spec.words import BUILTIN_DATASET, BUILTIN_WORD_PROBLEMS, DATASET_SUFFIXES

MIN_ROWS = 2  # a dataset file needs a training row and a held-out row


# ---- dataset files ----------------------------------------------------------------------------


MAX_LINE_BYTES = 16 * 2**20  # a text line of a dataset file longer than this is refused (bounded memory)
STREAM_ROWS = 4096  # Parquet rows read at a time


def _text_lines(stream: BinaryIO, name: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line of a binary stream, read one line at a time (bounded memory): UTF-8
    (a BOM allowed at the start), no NUL byte, at most MAX_LINE_BYTES a line; else a ValueError naming the line.
    The text keeps no line ending."""
    for lineno, raw in enumerate(iter(lambda: stream.readline(MAX_LINE_BYTES + 1), b""), start=1):
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            raise ValueError(f"{name}: line {lineno} is longer than {MAX_LINE_BYTES // 2**20} MiB")
        try:
            text = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{name}: line {lineno} is not UTF-8 text (a binary file?)") from None
        if "\x00" in text:
            raise ValueError(f"{name}: line {lineno} holds a NUL byte: a binary file, not text")
        yield lineno, text.removesuffix("\n")


FIELDS = ("question", "answer", "solution")  # an example's keys; a dataset's own column names map onto them


def _example(row: dict, where: str, name: str, fields: tuple[str, str, str] = FIELDS) -> dict:
    """One example from a row that has the columns ``fields`` (question, answer and maybe solution; by
    default named so), as ``{"question", "answer", "solution"}``.

    Text or numbers are accepted (an answer is often written as a number); an empty or missing value of
    the question or answer column is refused, naming ``where`` ("line 3", "row 3") and the column.
    """
    example = {}
    for key, column in zip(FIELDS, fields, strict=True):
        value = row.get(column)
        if value is None or value != value:  # missing, null, or NaN (an empty Parquet cell)
            value = ""
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise ValueError(f"{name}: {where}: '{column}' must be text or a number, got {type(value).__name__}")
        example[key] = str(value)
        if key != "solution" and not example[key].strip():
            raise ValueError(f"{name}: {where} has an empty '{column}'")
    return example


def iter_jsonl(source: bytes | str | Path, name: str) -> Iterator[tuple[int, object]]:
    """(line number, JSON value) for each non-blank line of a JSONL file (a path, read a line at a time) or of its
    bytes, lines counted from 1.

    Each line is checked as text first (see :func:`_text_lines`); a line that is not valid JSON is a ValueError
    naming ``name`` and the line, raised when that line is reached.
    >>> list(iter_jsonl(b'{"a": 1}\\n\\n[2]\\n', "f.jsonl"))
    [(1, {'a': 1}), (3, [2])]
    """
    with io.BytesIO(source) if isinstance(source, bytes) else open(source, "rb") as stream:
        for lineno, line in _text_lines(stream, name):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except (ValueError, RecursionError) as exc:  # JSONDecodeError, an over-long integer, too deep a nesting
                reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc).split(":")[0]
                raise ValueError(f"{name}: line {lineno} is not valid JSON ({reason})") from None
            yield lineno, value


def _jsonl_rows(path: Path, name: str, fields: tuple[str, str, str] = FIELDS) -> Iterator[dict]:
    """One JSON object per line; blank lines are skipped."""
    for lineno, row in iter_jsonl(path, name):
        if not isinstance(row, dict):
            raise ValueError(f"{name}: line {lineno} is not a JSON object (it is a {type(row).__name__})")
        if fields[0] not in row or fields[1] not in row:
            raise ValueError(f"{name}: line {lineno} needs the fields '{fields[0]}' and '{fields[1]}'")
        yield _example(row, f"line {lineno}", name, fields)


def _missing_columns(columns: list[str], name: str, fields: tuple[str, str, str] = FIELDS) -> None:
    missing = [k for k in fields[:2] if k not in columns]
    if missing:
        raise ValueError(
            f"{name}: needs the columns '{fields[0]}' and '{fields[1]}'; missing {', '.join(map(repr, missing))} "
            f"(found: {', '.join(map(repr, columns)) or 'none'})"
        )


def _csv_rows(path: Path, name: str, fields: tuple[str, str, str] = FIELDS) -> Iterator[dict]:
    """A header line naming the columns, then one row per line (quoted fields may span lines; a row's line is
    the one it ends on)."""
    with open(path, "rb") as stream:
        reader = csv.DictReader((text + "\n" for _, text in _text_lines(stream, name)), strict=True)
        try:
            columns = [c.strip() for c in reader.fieldnames or []]
            reader.fieldnames = columns
            _missing_columns(columns, name, fields)
            for row in reader:
                n_fields = len(columns) + len(row.get(None) or []) - sum(v is None for v in row.values())
                if n_fields != len(columns):
                    raise ValueError(
                        f"{name}: line {reader.reader.line_num} has {n_fields} "
                        f"field{'s' if n_fields != 1 else ''}, the header has {len(columns)}"
                    )
                if not any(row.values()):  # a line of empty fields (",,")
                    continue
                yield _example(row, f"line {reader.reader.line_num}", name, fields)
        except csv.Error as exc:
            raise ValueError(f"{name}: line {reader.reader.line_num} is not valid CSV ({exc})") from None


def _parquet_rows(path: Path, name: str, fields: tuple[str, str, str] = FIELDS) -> Iterator[dict]:
    """A Parquet table with the columns 'question' and 'answer' (and maybe 'solution'), read STREAM_ROWS rows at
    a time; rows count from 1."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(path)
        columns = table.schema_arrow.names
        _missing_columns(columns, name, fields)
        first = 1
        for batch in table.iter_batches(batch_size=STREAM_ROWS, columns=[k for k in fields if k in columns]):
            values = {k: batch.column(k).to_pylist() for k in batch.schema.names}
            for i in range(batch.num_rows):
                yield _example({k: v[i] for k, v in values.items()}, f"row {first + i}", name, fields)
            first += batch.num_rows
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(f"{name}: not a valid Parquet file ({str(exc).splitlines()[0]})") from None


READERS = {".jsonl": _jsonl_rows, ".csv": _csv_rows, ".parquet": _parquet_rows}


def iter_dataset_file(
    path: str | Path, name: str | None = None, fields: tuple[str, str, str] = FIELDS
) -> Iterator[dict]:
    """The rows ``{"question", "answer", "solution"}`` of a .jsonl, .csv or .parquet file, read as a stream (bounded
    memory whatever the file's size) from its columns ``fields`` (the question's, the answer's and the optional
    solution's; by default so named).

    ``question`` and ``answer`` are required and not empty, ``solution`` is optional. Anything wrong is a
    ValueError starting with ``name`` (default: the path) and, where there is one, the line or row, raised when
    it is reached: an unsupported extension, a missing, unreadable, empty or binary file, invalid JSON or CSV, a
    line that is not an object, a missing or empty field.
    """
    path = Path(path).expanduser()
    name = name or str(path)
    reader = READERS.get(path.suffix.lower())
    if reader is None:
        raise ValueError(
            f"{name}: unsupported file type {path.suffix or '(no extension)'!r}; "
            f"a dataset file is {', '.join(DATASET_SUFFIXES)}"
        )
    try:
        with open(path, "rb") as stream:
            blank = not any(chunk.strip() for chunk in iter(lambda: stream.read(1 << 16), b""))
    except FileNotFoundError:
        raise ValueError(f"{name}: no such file") from None
    except OSError as exc:
        raise ValueError(f"{name}: cannot read it ({exc.strerror or exc})") from None
    if blank:
        raise ValueError(f"{name}: the file is empty")
    yield from reader(path, name, fields)


def read_dataset_file(path: str | Path, name: str | None = None, fields: tuple[str, str, str] = FIELDS) -> list[dict]:
    """Every row of a dataset file (:func:`iter_dataset_file`), at least MIN_ROWS of them."""
    rows = list(iter_dataset_file(path, name, fields))
    if len(rows) < MIN_ROWS:
        raise ValueError(f"{name or path}: needs at least {MIN_ROWS} rows, found {len(rows)}")
    return rows


def check_dataset_file(
    path: str | Path, name: str | None = None, fields: tuple[str, str, str] = FIELDS, keep: int = 5
) -> tuple[int, list[dict]]:
    """Check a whole dataset file as a stream, keeping only its first ``keep`` rows: (row count, first rows).
    The same refusals as :func:`read_dataset_file`, in memory bounded by a line (a Parquet batch) whatever the
    file's size."""
    count, first = 0, []
    for row in iter_dataset_file(path, name, fields):
        if count < keep:
            first.append(row)
        count += 1
    if count < MIN_ROWS:
        raise ValueError(f"{name or path}: needs at least {MIN_ROWS} rows, found {count}")
    return count, first


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
        raise ValueError(
            f"{what} {name!r} (config {config or 'default'!r}, split {split!r}) could not be loaded: {first[:300]}"
        ) from None


def _hub_rows(name: str, config: str, split: str, fields: tuple[str, str, str]) -> list[dict]:
    """The rows of one split of a Hugging Face dataset, read from the columns ``fields``."""
    table = load_hub_split(name, config, split)
    missing = [k for k in fields[:2] if k not in table.column_names]
    if missing:
        raise ValueError(
            f"dataset {name!r}: no column {', '.join(map(repr, missing))} (its columns: "
            f"{', '.join(map(repr, table.column_names))}); set question_field / answer_field"
        )
    return [_example(row, f"row {i + 1} of split {split!r}", name, fields) for i, row in enumerate(table)]


def load_dataset(
    name: str, *, config: str = "", split: str = "train", eval_split: str = "", fields: tuple[str, str, str] = FIELDS
) -> tuple[list[dict], list[dict]]:
    """Load ``name`` as (train, heldout) example lists ``{"question", "answer", "solution"}``.

    - ``builtin-arith``: the built-in task (its own fixed held-out split).
    - ``builtin-word-problems``: the built-in word problems (word_problems.builtin_word_problems; the last 110 of
      1100 held out).
    - a local ``.jsonl``, ``.csv`` or ``.parquet`` file (:func:`read_dataset_file`), read from the columns
      ``fields``: its last 10% (at least 1, at most 200) is held out.
    - otherwise a Hugging Face dataset: a hub id such as ``openai/gsm8k`` (config ``main``) or a local
      dataset directory, loaded with ``datasets``: ``split`` trains; ``eval_split`` (when given) is held
      out, else the last 10% of ``split``, as for files.
    """
    if name == BUILTIN_DATASET:
        return builtin_examples()
    if name == BUILTIN_WORD_PROBLEMS:
        return builtin_word_problems()
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
