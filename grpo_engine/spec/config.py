"""The run spec's front door: ``validate_spec`` turns JSON into a checked RunSpec, and the words its readers need
come from here (``__all__``).

Pure Python (no torch): the web process imports this to validate a spec at launch and to build the launch form, the
worker and the engine read the same object.

Every key is defined once, as a field of :class:`~grpo_engine.spec.run_spec.RunSpec`. ``validate_spec`` fills
defaults, refuses unknown keys, checks each key's value on its own (``one_key``), then the rules between keys
(``between_keys``), each refusal a :class:`SpecError` that names the key.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from grpo_engine.spec.between_keys import MAX_TOTAL_STEPS, check_budget, check_spec
from grpo_engine.spec.one_key import check_range, check_report_to, coerce, is_gguf
from grpo_engine.spec.run_spec import FIELD_BY_NAME, FIELDS, RunSpec
from grpo_engine.spec.words import (
    BUILTIN_DATASET,
    BUILTIN_DATASETS,
    BUILTIN_MODEL,
    BUILTIN_WORD_PROBLEMS,
    MAX_TEXT,
    SpecError,
    shown,
)

__all__ = [  # what the spec's readers (the app, the workers, the engine) take from here
    "BUILTIN_DATASET",
    "BUILTIN_DATASETS",
    "BUILTIN_MODEL",
    "BUILTIN_WORD_PROBLEMS",
    "FIELDS",
    "FIELD_BY_NAME",
    "MAX_TEXT",
    "MAX_TOTAL_STEPS",
    "NOT_EMPTY",
    "RunSpec",
    "SpecError",
    "check_budget",
    "is_gguf",
    "is_local_path",
    "shown",
    "validate_spec",
]

FILE_SUFFIXES = (".jsonl", ".csv", ".parquet", ".json", ".gguf")  # a value ending so is a file, never a Hugging Face id
NOT_EMPTY = ("model", "dataset", "step_delimiter", "dataset_split", "question_field", "answer_field", "solution_field")


def is_local_path(value: str) -> bool:
    """Whether a run-spec value (``model``, ``reward_model``, ``dataset``, ``rm_data``) names a local path rather
    than a built-in name or a Hugging Face id.

    Local: it starts with '/', '.' or '~', ends with a data-file extension, has more than one '/'
    (a Hugging Face id is ``name`` or ``owner/name``), or exists relative to the current directory.
    """
    if not value or value == BUILTIN_MODEL or value in BUILTIN_DATASETS:
        return False
    return (
        value.startswith(("/", ".", "~"))
        or value.lower().endswith(FILE_SUFFIXES)
        or value.count("/") > 1
        or Path(value).exists()
    )


def _unknown_key_message(name: Any) -> str:
    """Why an unknown key is refused: the nearest valid key when one is close (a typo), else every valid key.

    >>> _unknown_key_message("groupsize")
    'unknown key; did you mean group_size?'
    """
    near = difflib.get_close_matches(str(name), FIELD_BY_NAME, n=1, cutoff=0.75)
    if near:
        return f"unknown key; did you mean {near[0]}?"
    return f"unknown key; valid keys are: {', '.join(FIELD_BY_NAME)}"


def validate_spec(spec: dict[str, Any] | None) -> RunSpec:
    """Fill defaults and check every key, then the rules between keys; raise SpecError naming the first bad key.

    Missing keys take their documented default; ``None`` counts as missing.
    """
    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        raise SpecError(None, f"the run spec must be a JSON object, got {type(spec).__name__}")
    unknown = sorted(set(spec) - set(FIELD_BY_NAME))
    if unknown:
        raise SpecError(unknown[0], _unknown_key_message(unknown[0]))
    values: dict[str, Any] = {}
    for f in FIELDS:
        raw = spec.get(f.name)
        value = f.default if raw is None else check_report_to(raw) if f.name == "report_to" else coerce(f, raw)
        check_range(f, value)
        values[f.name] = value
    for name in NOT_EMPTY:
        if not values[name]:
            raise SpecError(name, "must not be empty")
    built = RunSpec(**values)
    check_spec(built)
    return built
