"""How one run-spec key is declared: :func:`key`, a dataclass field of a section's class (grpo_engine/spec/keys/)
carrying its default, help, bounds, the form's section, fold and label, and when a run reads it; :class:`Field`,
the same as the Launch form, validation and the docs read it (run_spec.FIELDS). Pure Python (no torch).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from grpo_engine.spec.words import MAX_TEXT, SECTIONS


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
