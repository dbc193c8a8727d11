"""The run spec: what a GRPO run is launched with.

Every key is defined once, as a field of one of the sections' classes in grpo_engine/spec/keys/ (``key``: its type,
default, allowed range, the one-line help the Launch form and the docs show, the form's section and label, and when a
run reads it, a rule of ``applicability``). :class:`RunSpec` gathers them; ``FIELDS`` lists them in the form's order.
``config.validate_spec`` builds a checked RunSpec from JSON. Pure Python (no torch): the web process builds the form
and the docs from these.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass
from dataclasses import fields as dc_fields
from typing import Any, get_type_hints

from grpo_engine.spec.applicability import step_checker
from grpo_engine.spec.keys.algorithm import AlgorithmKeys
from grpo_engine.spec.keys.field import Field
from grpo_engine.spec.keys.model_data import ModelAndDataKeys
from grpo_engine.spec.keys.reward import RewardKeys
from grpo_engine.spec.keys.runtime import RuntimeKeys


# A dataclass takes its bases' fields from the last base to the first: the form's order, Model & data first.
@dataclass(frozen=True)
class RunSpec(RuntimeKeys, RewardKeys, AlgorithmKeys, ModelAndDataKeys):
    """A run spec: one attribute per key, each with its default, bounds, help and place in the form (``key``).
    ``validate_spec`` builds a checked one from JSON; ``FIELDS`` lists the keys for the launch form, the API and the
    docs."""

    @property
    def total_steps(self) -> int:
        return self.iterations * self.steps_per_iteration

    @property
    def evaluates_only(self) -> bool:
        """``steps_per_iteration`` 0: the run evaluates its model once and trains nothing (no reference, no saved
        policy)."""
        return self.steps_per_iteration == 0

    @property
    def step_checker(self) -> str:
        """What labels steps: 'builtin', 'arithmetic' or 'rollouts' (``step_labels`` 'auto' chosen by the dataset)."""
        return step_checker(self.to_dict())

    @property
    def label_source(self) -> str:
        """What labels a run's outputs, in words: the verifier (outcome supervision), else the rule that labels its
        steps (with a learned PRM too: the labels it learns from, recorded beside its scores). The Groups tab's
        cards, ``/get_group`` and the reward model's log lines all say it so.

        >>> from grpo_engine.spec.config import validate_spec
        >>> validate_spec({"supervision": "process", "step_labels": "arithmetic"}).label_source
        'the arithmetic step checker'
        >>> validate_spec({"supervision": "process", "step_labels": "rollouts", "label_completer": "Qwen/Qwen2.5-Math-7B"}).label_source
        'rollouts by Qwen/Qwen2.5-Math-7B, N=4, hard estimate'
        """
        if self.supervision == "outcome":
            return "the verifier"
        by = f" by {self.label_completer}" if self.label_completer else ""
        return {
            "builtin": "the built-in task's exact step checker",
            "arithmetic": "the arithmetic step checker",
            "rollouts": f"rollouts{by}, N={self.label_rollouts}, {self.label_estimate} estimate",
        }[self.step_checker]

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dc_fields(self)}


_TYPES = get_type_hints(RunSpec)
FIELDS: tuple[Field, ...] = tuple(
    Field(f.name, _TYPES[f.name], f.default if f.default_factory is MISSING else f.default_factory(), **f.metadata)
    for f in dc_fields(RunSpec)
)
FIELD_BY_NAME = {f.name: f for f in FIELDS}
DEFAULTS = {f.name: f.default for f in FIELDS}
