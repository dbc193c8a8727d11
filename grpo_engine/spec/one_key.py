"""One run-spec key's value on its own, each refusal a SpecError that names the key: its conversion from JSON (or
the form's text) to the key's type (:func:`coerce`), its choices and bounds (:func:`check_range`), and the keys whose
value needs more than that: ``report_to``'s trackers and ``optimizer``'s library installed here, ``question_template``'s
slot, a ``.gguf`` model's reader. config.validate_spec applies them to every key; pure Python (no torch).
"""

from __future__ import annotations

import importlib.util
import json
import math
from typing import Any

from grpo_engine.rewards.reward_functions import check_reward_list
from grpo_engine.spec.keys.field import Field
from grpo_engine.spec.words import SpecError, shown

# report_to's trackers: name (also the library's import name) -> what to pip install for it
TRACKERS = {"tensorboard": "tensorboard", "mlflow": "mlflow-skinny", "wandb": "wandb"}
QUESTION_SLOT = "{question}"  # where question_template puts the question
# optimizer's choices that need a library: choice -> (its import name, what to pip install for it)
OPTIMIZER_LIBRARIES = {"adamw_8bit": ("bitsandbytes", "'grpo-dashboard[8bit]'")}


def check_report_to(value: Any) -> list[str]:
    """``report_to`` as a list of tracker names: a JSON list, or text (the Launch form's) holding a JSON list or names
    separated by commas. Refused (SpecError naming the key): an unknown or repeated name, and one whose library is not
    installed here; the worker validates the spec again, so a run fails at its start on a worker without it.

    >>> check_report_to(" ")
    []
    >>> try:
    ...     check_report_to(["neptune"])
    ... except SpecError as e:
    ...     print(e)
    report_to: unknown tracker 'neptune'; the trackers are 'tensorboard', 'mlflow', 'wandb'
    """
    allowed = ", ".join(map(repr, TRACKERS))
    if isinstance(value, str):
        text = value.strip()
        try:
            value = json.loads(text) if text.startswith("[") else [n.strip() for n in text.split(",") if n.strip()]
        except json.JSONDecodeError as e:
            raise SpecError(
                "report_to",
                f"must be a list of tracker names or names separated by commas, got text that is not JSON ({e})",
            ) from None
    if not isinstance(value, (list, tuple)):
        raise SpecError(
            "report_to", f"must be a list of tracker names ({allowed}), got {type(value).__name__} {shown(value)}"
        )
    names: list[str] = []
    for name in value:
        if not isinstance(name, str) or name.strip().lower() not in TRACKERS:
            raise SpecError("report_to", f"unknown tracker {shown(name)}; the trackers are {allowed}")
        name = name.strip().lower()
        if name in names:
            raise SpecError("report_to", f"names {name!r} twice")
        if importlib.util.find_spec(name) is None:
            raise SpecError(
                "report_to",
                f"{name!r} is not installed on this machine: pip install {TRACKERS[name]} "
                "(or all three: pip install 'grpo-dashboard[trackers]')",
            )
        names.append(name)
    return names


def check_prompt_keys(values: dict[str, Any]) -> None:
    """Refuse, naming the key, a question_template without exactly one {question} (the question would be lost
    or asked twice), and a .gguf model where the gguf package that reads it is missing.

    >>> check_prompt_keys({"question_template": "Q: {question}", "model": "m"})
    >>> try:
    ...     check_prompt_keys({"question_template": "Solve it.", "model": "m"})
    ... except SpecError as e:
    ...     print(e)
    question_template: must hold {question} once, where the question goes; got 'Solve it.'
    """
    template = values["question_template"]
    if template and template.count(QUESTION_SLOT) != 1:
        raise SpecError(
            "question_template", f"must hold {QUESTION_SLOT} once, where the question goes; got {shown(template)}"
        )
    if is_gguf(values["model"]) and importlib.util.find_spec("gguf") is None:
        raise SpecError(
            "model",
            f"{shown(values['model'])} is a .gguf file, which needs the gguf package to read: pip install 'gguf>=0.10'",
        )


def check_optimizer(optimizer: str) -> None:
    """Refuse (SpecError naming ``optimizer``) a choice whose library is not installed here. Launch checks it on the
    web server's machine and the worker again on its own, so a run fails at its start on a worker without it."""
    library = OPTIMIZER_LIBRARIES.get(optimizer)
    if library and importlib.util.find_spec(library[0]) is None:
        raise SpecError(
            "optimizer",
            f"{optimizer!r} needs {library[0]}, which is not installed on this machine: pip install {library[1]} "
            "(or use 'adamw')",
        )


def is_gguf(model: str) -> bool:
    """Whether ``model`` names a local GGUF file (converted once into a model directory where it is loaded)."""
    return model.lower().endswith(".gguf")


def coerce(field: Field, value: Any) -> Any:
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


def check_range(field: Field, value: Any) -> None:
    """Refuse, naming the key, a value outside the field's choices or bounds."""
    if field.choices is not None and value not in field.choices:
        raise SpecError(field.name, f"must be one of {', '.join(map(repr, field.choices))}, got {shown(value)}")
    if field.min is not None:
        if field.min_exclusive and not value > field.min:
            raise SpecError(field.name, f"must be greater than {field.min:g}, got {shown(value)}")
        if not field.min_exclusive and value < field.min:
            raise SpecError(field.name, f"must be at least {field.min:g}, got {shown(value)}")
    if field.max is not None and value > field.max:
        raise SpecError(field.name, f"must be at most {field.max:g}, got {shown(value)}")
