"""The run spec's shared words: the built-in names, the Launch form's sections, the longest text a key takes, and
:class:`SpecError`, the refusal that names its key (with :func:`shown`, a value as a refusal quotes it), and
:func:`decode_delimiter`, a ``step_delimiter`` as the text it stands for. Pure Python (no torch); every other module of
the spec reads these.
"""

from __future__ import annotations

import re
from typing import Any

MAX_TEXT = 4096  # the longest text value a key takes (paths, ids, field names); ``name`` takes 200
BUILTIN_MODEL = "builtin-arith"  # the built-in tiny model (grpo_engine.model.model)
BUILTIN_DATASET = "builtin-arith"  # the built-in arithmetic questions (grpo_engine.data.builtin_task)
BUILTIN_WORD_PROBLEMS = "builtin-word-problems"  # generated word problems (grpo_engine.data.word_problems)
BUILTIN_DATASETS = (BUILTIN_DATASET, BUILTIN_WORD_PROBLEMS)  # the datasets a run reads without a file or a download
RUN_MODEL_PREFIX = "run:"  # ``model: run:<id>[@<step>]``: an earlier run's trained policy, or a checkpoint's
DATASET_SUFFIXES = (".jsonl", ".csv", ".parquet")  # the dataset files grpo_engine.data.data reads

# The Launch form's sections, in its order; each key names its own (grpo_engine/spec/keys/, a module a section).
MODEL_AND_DATA, ALGORITHM, REWARD, RUNTIME = "Model & data", "Algorithm", "Reward", "Runtime & saving"
SECTIONS = (MODEL_AND_DATA, ALGORITHM, REWARD, RUNTIME)


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


def run_model(value: str) -> tuple[int, int | None] | None:
    """(run, step) of an earlier run's policy that ``value`` names as a model: its trained policy, ``run:<id>``
    (step None), or the policy of one of its checkpoints, ``run:<id>@<step>``; None for any other value.

    >>> run_model("run:12"), run_model("run:12@30"), run_model("HuggingFaceTB/SmolLM2-135M-Instruct"), run_model("run:x")
    ((12, None), (12, 30), None, None)
    """
    found = re.fullmatch(rf"{RUN_MODEL_PREFIX}(\d+)(?:@(\d+))?", value.strip())
    if not found:
        return None
    return int(found.group(1)), None if found.group(2) is None else int(found.group(2))


def run_model_id(value: str) -> int | None:
    """The run whose policy ``value`` names as a model (``run:<id>`` or ``run:<id>@<step>``), else None.

    >>> run_model_id("run:12"), run_model_id("run:12@30"), run_model_id("run:x")
    (12, 12, None)
    """
    found = run_model(value)
    return found[0] if found else None
