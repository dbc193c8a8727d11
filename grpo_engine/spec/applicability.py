"""When a run-spec key is read: one rule for each key that only some runs read.

A key's rule is part of its metadata in :class:`~grpo_engine.spec.run_spec.RunSpec` (``key(applies=...)``). The one
rule serves two readers: validate_spec refuses, naming the key, a value other than the default where the key would
not be read (it would silently do nothing), and the Launch form hides the key there. A key without a rule is read by
every run.

A rule reads the other keys' values from a mapping: the validated values, or the Launch form's, filled by
:func:`form_values` (its boxes hold text: ``rewards`` as a JSON list, empty boxes for defaults). Pure Python.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from grpo_engine.spec.words import BUILTIN_DATASET, BUILTIN_DATASETS, DATASET_SUFFIXES, shown

Values = Mapping[str, Any]


@dataclass(frozen=True)
class Applies:
    """Whether a key is read (``test`` over the spec's values) and, where it is not, why (``refusal``: the text
    after "key: " in the SpecError, from the values)."""

    test: Callable[[Values], bool]
    refusal: Callable[[Values], str]

    def __call__(self, values: Values) -> bool:
        return bool(self.test(values))


def own_dataset(values: Values) -> bool:
    """Whether the dataset is anything but a built-in one (its columns are then read)."""
    return values["dataset"] not in BUILTIN_DATASETS


def hub_dataset(values: Values) -> bool:
    """Whether the dataset is read through Hugging Face datasets: a hub id or a dataset directory, not a .jsonl, .csv
    or .parquet file and not the built-in set. Its configuration and splits are then read.

    >>> [hub_dataset({"dataset": d}) for d in ("openai/gsm8k", "/data/train.JSONL", BUILTIN_DATASET)]
    [True, False, False]
    """
    return own_dataset(values) and not str(values["dataset"]).lower().endswith(DATASET_SUFFIXES)


def learned_reward(values: Values) -> bool:
    """Whether the run learns a reward model (reward 'model')."""
    return values["reward"] == "model"


def process(values: Values) -> bool:
    """Whether each reasoning step is rewarded (supervision 'process')."""
    return values["supervision"] == "process"


def step_checker(values: Values) -> str:
    """What labels steps: step_labels, or for 'auto' 'builtin' on the built-in dataset and 'rollouts' elsewhere
    (RunSpec.step_checker reads this too)."""
    labels = values["step_labels"]
    if labels != "auto":
        return labels
    return "builtin" if values["dataset"] == BUILTIN_DATASET else "rollouts"


def labelled_by_rollouts(values: Values) -> bool:
    """Whether the steps are labelled by rollouts (Math-Shepherd): process supervision whose steps are not rewarded
    by named ``rewards``, and step_labels 'rollouts' ('auto' on a dataset other than the built-in one).

    >>> v = {"supervision": "process", "step_labels": "auto", "dataset": "gsm8k.jsonl", "rewards": []}
    >>> labelled_by_rollouts(v), labelled_by_rollouts({**v, "rewards": [{"name": "f.py:steps"}]})
    (True, False)
    """
    return process(values) and not values["rewards"] and step_checker(values) == "rollouts"


def _not_rollouts(values: Values) -> str:
    if not process(values):
        why = "supervision is 'outcome'"
    elif values["rewards"]:
        why = "the steps are rewarded by the run's rewards"
    else:
        why = f"steps are labelled by {shown(step_checker(values))}"
        if values["step_labels"] == "auto":
            why += " (step_labels 'auto' on the built-in dataset)"
    return (
        f"is only used when steps are labelled by rollouts (supervision 'process', step_labels 'rollouts'), but {why}"
    )


def _dataset_is(values: Values) -> str:
    if values["dataset"] in BUILTIN_DATASETS:
        return f"the built-in {shown(values['dataset'])}"
    return f"the file {shown(values['dataset'])}"


HUB_DATASET = Applies(
    hub_dataset,
    lambda v: (
        f"is only read from a Hugging Face dataset (a hub id or a dataset directory), but dataset is "
        f"{_dataset_is(v)}; leave it out"
    ),
)
OWN_DATASET = Applies(
    own_dataset,
    lambda v: f"names a column of your dataset, but dataset is the built-in {shown(v['dataset'])}; leave it out",
)
LEARNED_REWARD = Applies(
    learned_reward,
    lambda v: "is only used with reward 'model'; leave it out with reward 'rule'",
)
REWARD_MODEL_START = Applies(
    learned_reward,
    lambda v: "is only used with reward 'model'; leave it empty with reward 'rule'",
)
PRM_DATA = Applies(
    lambda v: learned_reward(v) and process(v),
    lambda v: "is PRM training data: only used with reward 'model' and supervision 'process'",
)
PROCESS = Applies(
    process,
    lambda v: f"is only used with supervision 'process' (got supervision {shown(v['supervision'])}); leave it out",
)
STEP_LABELS = Applies(
    process,
    lambda v: (
        f"labels reasoning steps: only used with supervision 'process' (got supervision "
        f"{shown(v['supervision'])}); leave it 'auto'"
    ),
)
ROLLOUT_LABELS = Applies(labelled_by_rollouts, _not_rollouts)


def _format_not_read(values: Values) -> str:
    if process(values):
        return (
            "is added to outcome rewards, but supervision 'process' rewards each step by its label: set it to 0 or "
            "use supervision 'outcome'"
        )
    return (
        f'is replaced by the named rewards: set it to 0 and add {{"name": "format", "weight": '
        f"{values['format_reward']:g}}} to rewards"
    )


FORMAT_REWARD = Applies(lambda v: not process(v) and not v["rewards"], _format_not_read)
RULE_REWARDS = Applies(
    lambda v: not learned_reward(v),
    lambda v: (
        "are the rule's rewards; with reward 'model' a learned reward model scores the outputs: leave "
        "rewards empty or use reward 'rule'"
    ),
)
DYNAMIC_SAMPLING = Applies(
    lambda v: bool(v["skip_zero_spread"]),
    lambda v: "is only used with skip_zero_spread true; leave it out or turn that on",
)
OVERLONG = Applies(
    lambda v: bool(v["overlong_penalty"]),
    lambda v: "is only used with overlong_penalty > 0; leave it out or set a penalty",
)

EVALUATING = Applies(
    lambda v: int(v["eval_every"]) > 0,
    lambda v: "is only used when the run evaluates, but eval_every is 0; set eval_every or leave it out",
)
SAMPLED_EVAL = Applies(
    lambda v: int(v["eval_every"]) > 0 and int(v["eval_samples"]) > 0,
    lambda v: "is only used with eval_samples > 0 (and eval_every > 0); set eval_samples or leave it out",
)

SEVERAL_PROCESSES = Applies(
    lambda v: int(v["devices"]) > 1,
    lambda v: "shares the policy out across the run's processes, but devices is 1; set devices to 2 or more",
)


def form_values(form: Values, defaults: Values) -> dict[str, Any]:
    """The Launch form's values as a rule reads them: an empty or missing box takes its key's default, and the
    ``rewards`` box (a JSON list) is read as a list (text that is not JSON counts as a non-empty list: launch
    refuses it, naming rewards).

    >>> form_values({"rewards": '[{"name": "format"}]', "dataset": ""}, {"rewards": [], "dataset": "builtin-arith"})
    {'rewards': [{'name': 'format'}], 'dataset': 'builtin-arith'}
    """
    values = dict(defaults)
    for name, value in form.items():
        if value is not None and value != "":
            values[name] = value
    rewards = values.get("rewards")
    if isinstance(rewards, str):
        try:
            values["rewards"] = json.loads(rewards) if rewards.strip() else []
        except ValueError:
            values["rewards"] = [rewards]
    return values
