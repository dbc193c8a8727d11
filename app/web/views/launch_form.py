"""The Launch form's layout, as data, read from each key's RunSpec metadata (grpo_engine.spec.run_spec): which
section it sits in, whether it is shown at once or folded under "More options", the label a user reads, and when it
applies (the rule launch enforces); and a preset's values in the form's order (the presets: grpo_engine.spec.presets).

Pure (no Gradio): app.web.tabs.launch builds the components from it, and tests check that every RunSpec key appears
exactly once and that every preset is a valid run spec.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_engine.spec.applicability import form_values
from grpo_engine.spec.presets import PRESETS
from grpo_engine.spec.run_spec import DEFAULTS, FIELD_BY_NAME, FIELDS
from grpo_engine.spec.words import SECTIONS as SECTION_TITLES


@dataclass(frozen=True)
class Section:
    """One part of the form: its title, the keys shown at once and the keys folded under "More options"."""

    title: str
    essential: tuple[str, ...]
    more: tuple[str, ...]


# Each key's section, fold and label are in its RunSpec metadata; the sections hold the keys in RunSpec's order.
SECTIONS = tuple(
    Section(
        title,
        tuple(f.name for f in FIELDS if f.section == title and not f.fold),
        tuple(f.name for f in FIELDS if f.section == title and f.fold),
    )
    for title in SECTION_TITLES
)


def label(key: str) -> str:
    """What the form calls a key, with the key itself for API users: 'Group size G · group_size'.

    >>> label("group_size"), label("seed")
    ('Group size G · group_size', 'Seed · seed')
    """
    words = FIELD_BY_NAME[key].label or key.replace("_", " ").capitalize()
    return f"{words} · {key}"


# When a key applies: its rule in RunSpec's metadata (grpo_engine.spec.applicability), the one launch enforces.
APPLIES = {f.name: f.applies for f in FIELDS if f.applies is not None}
# The keys whose value decides whether another key applies: the form re-checks when one of them changes.
DECIDING = (
    "dataset",
    "supervision",
    "reward",
    "rewards",
    "step_labels",
    "skip_zero_spread",
    "overlong_penalty",
    "devices",
    "eval_every",
    "eval_samples",
)


def applies(key: str, values: dict) -> bool:
    """Whether ``key`` means anything for a run spec with these ``values`` (hidden in the form when not): its rule,
    over the form's values with the defaults for what they leave out.

    >>> applies("rm_samples", {"reward": "rule"}), applies("rm_samples", {"reward": "model"})
    (False, True)
    >>> applies("step_delimiter", {"supervision": "process"}), applies("group_size", {})
    (True, True)
    """
    rule = APPLIES.get(key)
    return rule is None or rule(form_values(values, DEFAULTS))


def applicable(spec: dict) -> dict:
    """The keys of a form's ``spec`` that apply to its values (:func:`applies`): a hidden key is left out, so it takes
    its default instead of a value the user can no longer see.

    >>> applicable({"supervision": "outcome", "step_labels": "rollouts", "group_size": 4})
    {'supervision': 'outcome', 'group_size': 4}
    """
    return {k: v for k, v in spec.items() if applies(k, spec)}


def section_of(key: str) -> int:
    """The index in SECTIONS of the section holding ``key``."""
    return next(i for i, s in enumerate(SECTIONS) if key in s.essential or key in s.more)


def preset_values(preset: str) -> list:
    """The form's values (in FIELDS order) for a preset: the defaults with the preset's keys over them."""
    chosen = PRESETS[preset]
    return [chosen.get(f.name, f.default) for f in FIELDS]
