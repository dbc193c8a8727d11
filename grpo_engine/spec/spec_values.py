"""One run-spec key's value: its description (:class:`Field`: type, default, bounds, help), the conversion of a JSON
value to its type and the check of its range, each refusal a :class:`SpecError` that names the key.

Pure Python (no torch): config.validate_spec applies these to every key of a spec.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from grpo_engine.rewards.reward_functions import check_reward_list

MAX_TEXT = 4096  # the longest text value a key takes (paths, ids, field names); ``name`` takes 200
BUILTIN_MODEL = "builtin-arith"  # the built-in tiny model (grpo_engine.model.model)
BUILTIN_DATASET = "builtin-arith"  # the built-in arithmetic questions (grpo_engine.data.builtin_task)
BUILTIN_WORD_PROBLEMS = "builtin-word-problems"  # generated word problems (grpo_engine.data.word_problems)
BUILTIN_DATASETS = (BUILTIN_DATASET, BUILTIN_WORD_PROBLEMS)  # the datasets a run reads without a file or a download
DATASET_SUFFIXES = (".jsonl", ".csv", ".parquet")  # the dataset files grpo_engine.data.data reads

# The Launch form's sections, in its order; each key names its own (grpo_engine/spec/keys/, a module a section).
MODEL_AND_DATA, ALGORITHM, REWARD, RUNTIME = "Model & data", "Algorithm", "Reward", "Runtime & saving"
SECTIONS = (MODEL_AND_DATA, ALGORITHM, REWARD, RUNTIME)


@dataclass(frozen=True)
class Field:
    """One run-spec key as the launch form, validation and docs read it: its type, default, bounds, help, and
    where the form shows it and when a run reads it."""

    name: str
    type: type
    default: Any
    help: str
    min: float | None = None  # inclusive lower bound
    max: float | None = None  # inclusive upper bound
    choices: tuple | None = None
    min_exclusive: bool = False  # if True, the value must be > min
    max_length: int = MAX_TEXT  # text: the longest value
    note: str = ""  # what the type, bounds and choices leave unsaid: a list's form, a rule between keys (docs)
    section: str = ""  # the Launch form's section (SECTIONS)
    fold: bool = False  # under the section's "More options" rather than shown at once
    label: str = ""  # what the form calls the key, where its name spaced and capitalised would not say it
    applies: Any = None  # applicability.Applies: when the key is read; None: by every run


def key(
    default: Any,
    help: str,
    *,
    section: str,
    fold: bool = False,
    label: str = "",
    applies: Any = None,
    min: float | None = None,
    max: float | None = None,
    choices: tuple | None = None,
    min_exclusive: bool = False,
    max_length: int = MAX_TEXT,
    note: str = "",
):
    """One run-spec key of :class:`RunSpec`: its default, and in the field's metadata its one-line help; the form's
    ``section``, whether it is folded under "More options" (``fold``) and its ``label`` where the key's own words
    would not say it; ``applies``, the rule of when a run reads it (None: always); inclusive bounds
    (``min_exclusive``: the value must be > min), allowed values, for text its longest length, and a ``note`` for the
    docs' "allowed" column on what the rest leaves unsaid (a list's form, a rule between keys)."""
    if section not in SECTIONS:
        raise ValueError(f"unknown section {section!r}")
    metadata = {
        "help": help,
        "section": section,
        "fold": fold,
        "label": label,
        "applies": applies,
        "min": min,
        "max": max,
        "choices": choices,
        "min_exclusive": min_exclusive,
        "max_length": max_length,
        "note": note,
    }
    if isinstance(default, list):  # a list default: each spec gets its own copy
        return field(default_factory=default.copy, metadata=metadata)
    return field(default=default, metadata=metadata)


class SpecError(ValueError):
    """A run spec was refused. ``key`` names the offending key (None for the spec as a whole)."""

    def __init__(self, key: str | None, message: str):
        self.key = key
        super().__init__(f"{key}: {message}" if key else message)


def decode_delimiter(value: str) -> str:
    """A ``step_delimiter`` as text: the escapes \\n and \\t (as a form or JSON holds them) made real."""
    return value.replace("\\n", "\n").replace("\\t", "\t")


def shown(value: Any) -> str:
    """A value in an error message: its repr, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _coerce(field: Field, value: Any) -> Any:
    """Convert a JSON value to the field's type, or raise SpecError naming the key."""
    want = field.type
    if want is list:
        return _coerce_list(field, value)
    if want is bool:
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        if not isinstance(value, bool):
            raise SpecError(field.name, f"must be true or false, got {type(value).__name__} {shown(value)}")
        return value
    if want is str:
        if not isinstance(value, str):
            raise SpecError(field.name, f"must be a string, got {type(value).__name__} {shown(value)}")
        if len(value) > field.max_length:
            raise SpecError(field.name, f"must be at most {field.max_length} characters, got {len(value)}")
        if "\x00" in value:
            raise SpecError(field.name, "must not contain a NUL character")
        return value.strip()
    if isinstance(value, bool):  # bool is an int subclass: refuse it for numbers
        raise SpecError(field.name, f"must be a number, got a boolean {shown(value)}")
    if want is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, str):
            try:
                value = int(value.strip())
            except ValueError:
                raise SpecError(field.name, f"must be an integer, got {shown(value)}") from None
        if not isinstance(value, int):
            raise SpecError(field.name, f"must be an integer, got {type(value).__name__} {shown(value)}")
        return value
    if want is float:
        if isinstance(value, str):
            try:
                value = float(value.strip())
            except ValueError:
                raise SpecError(field.name, f"must be a number, got {shown(value)}") from None
        if not isinstance(value, (int, float)):
            raise SpecError(field.name, f"must be a number, got {type(value).__name__} {shown(value)}")
        value = float(value)
        if not math.isfinite(value):
            raise SpecError(field.name, f"must be a finite number, got {shown(value)}")
        return value
    raise TypeError(f"unsupported field type {want}")  # pragma: no cover


def _coerce_list(field: Field, value: Any) -> list:
    """A JSON list, or its text (as the form sends it; empty text = []), as a list of checked items (``rewards``:
    reward_functions.check_reward_list), or SpecError naming the key."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError as e:
            raise SpecError(field.name, f"must be a JSON list, got text that is not JSON ({e})") from None
    if not isinstance(value, (list, tuple)):
        raise SpecError(field.name, f"must be a list, got {type(value).__name__} {shown(value)}")
    try:
        return check_reward_list(value)
    except ValueError as e:
        raise SpecError(field.name, str(e)) from None


def _check_range(field: Field, value: Any) -> None:
    if field.choices is not None and value not in field.choices:
        raise SpecError(field.name, f"must be one of {', '.join(map(repr, field.choices))}, got {shown(value)}")
    if field.min is not None:
        if field.min_exclusive and not value > field.min:
            raise SpecError(field.name, f"must be greater than {field.min:g}, got {shown(value)}")
        if not field.min_exclusive and value < field.min:
            raise SpecError(field.name, f"must be at least {field.min:g}, got {shown(value)}")
    if field.max is not None and value > field.max:
        raise SpecError(field.name, f"must be at most {field.max:g}, got {shown(value)}")
