"""The run spec: defaults, coercion, and errors that name the offending key."""

from __future__ import annotations

import math

import pytest

from grpo_engine.spec.config import FIELDS, RunSpec, SpecError, validate_spec


def test_defaults():
    spec = validate_spec({})
    assert isinstance(spec, RunSpec)
    assert spec.to_dict() == RunSpec().to_dict() == {f.name: f.default for f in FIELDS}
    assert validate_spec(None) == spec
    assert spec.model == "builtin-arith" and spec.dataset == "builtin-arith"
    assert spec.supervision == "outcome" and spec.reward == "rule"
    assert spec.total_steps == spec.iterations * spec.steps_per_iteration
    for field in FIELDS:
        assert isinstance(getattr(spec, field.name), field.type), field.name


def test_none_counts_as_missing_and_values_round_trip():
    spec = validate_spec({"group_size": None, "batch_size": 3, "iterations": 2, "steps_per_iteration": 5})
    assert spec.group_size == RunSpec().group_size
    assert spec.total_steps == 10
    assert validate_spec(spec.to_dict()) == spec


def _bad_type_value(field):
    """A value of the wrong type for the field."""
    return 5 if field.type is str else "not a number"


def _out_of_range_values(field):
    """Values just outside the field's range or choices."""
    if field.choices is not None:
        return ["bogus"]
    values = []
    if field.min is not None:
        values.append(field.min if field.min_exclusive else field.min - 1)
    if field.max is not None:
        values.append(field.max + 1)
    return [field.type(v) for v in values]


@pytest.mark.parametrize("field", FIELDS, ids=lambda f: f.name)
def test_wrong_type_names_the_key(field):
    with pytest.raises(SpecError) as info:
        validate_spec({field.name: _bad_type_value(field)})
    assert info.value.key == field.name
    assert field.name in str(info.value)


@pytest.mark.parametrize(
    "field", [f for f in FIELDS if f.choices or f.min is not None or f.max is not None], ids=lambda f: f.name
)
def test_out_of_range_names_the_key(field):
    for value in _out_of_range_values(field):
        with pytest.raises(SpecError) as info:
            validate_spec({field.name: value})
        assert info.value.key == field.name, value
        assert field.name in str(info.value)


@pytest.mark.parametrize("field", [f for f in FIELDS if f.type in (int, float)], ids=lambda f: f.name)
def test_bool_is_refused_for_numbers(field):
    for value in (True, False):
        with pytest.raises(SpecError) as info:
            validate_spec({field.name: value})
        assert info.value.key == field.name


def test_unknown_key_is_named():
    with pytest.raises(SpecError) as info:
        validate_spec({"group_size": 4, "learning_rat": 0.1})
    assert info.value.key == "learning_rat"
    assert "learning_rat" in str(info.value)


def test_spec_must_be_an_object():
    with pytest.raises(SpecError) as info:
        validate_spec([("group_size", 4)])
    assert info.value.key is None


def test_strings_are_coerced_for_numbers():
    spec = validate_spec({"group_size": " 4 ", "clip_eps": "0.1", "kl_coef": "0", "learning_rate": "1e-5"})
    assert spec.group_size == 4 and isinstance(spec.group_size, int)
    assert spec.clip_eps == 0.1 and spec.kl_coef == 0.0 and spec.learning_rate == 1e-5
    assert isinstance(spec.kl_coef, float)


def test_numbers_are_coerced_between_int_and_float():
    spec = validate_spec({"group_size": 4.0, "kl_coef": 1})
    assert spec.group_size == 4 and isinstance(spec.group_size, int)
    assert spec.kl_coef == 1.0 and isinstance(spec.kl_coef, float)
    for bad in (4.5, "4.5"):
        with pytest.raises(SpecError) as info:
            validate_spec({"group_size": bad})
        assert info.value.key == "group_size"


@pytest.mark.parametrize("value", [math.nan, math.inf, "nan", "-inf"])
def test_non_finite_numbers_are_refused(value):
    with pytest.raises(SpecError) as info:
        validate_spec({"kl_coef": value})
    assert info.value.key == "kl_coef"


def test_strings_are_stripped_and_model_dataset_must_not_be_empty():
    assert validate_spec({"name": "  run a  "}).name == "run a"
    assert validate_spec({"name": "   "}).name == ""
    for key in ("model", "dataset"):
        with pytest.raises(SpecError) as info:
            validate_spec({key: "  "})
        assert info.value.key == key


def test_reward_model_key_needs_reward_model():
    assert validate_spec({"reward": "model"}).reward == "model"
    assert validate_spec({"reward": "model", "reward_model": "some/rm"}).reward_model == "some/rm"
    with pytest.raises(SpecError) as info:
        validate_spec({"reward": "rule", "reward_model": "some/rm"})
    assert info.value.key == "reward_model"
    with pytest.raises(SpecError) as info:
        validate_spec({"reward": "learned"})
    assert info.value.key == "reward"


def test_bounds_are_inclusive_where_documented():
    spec = validate_spec({"group_size": 2, "kl_coef": 0.0, "clip_eps": 1.0, "eval_every": 0, "lora_rank": 0})
    assert (spec.group_size, spec.kl_coef, spec.clip_eps, spec.eval_every) == (2, 0.0, 1.0, 0)


def test_step_labels_follow_the_dataset_and_builtin_is_refused_elsewhere():
    assert validate_spec({}).step_checker == "builtin"  # auto on the built-in task
    assert validate_spec({"dataset": "/data/gsm8k.jsonl"}).step_checker == "rollouts"  # auto elsewhere
    assert validate_spec({"supervision": "process", "step_labels": "arithmetic"}).step_checker == "arithmetic"
    with pytest.raises(
        SpecError,
        match=r"^step_labels: 'builtin' checks only the built-in task's questions, but "
        r"dataset is 'openai/gsm8k'",
    ):
        validate_spec({"supervision": "process", "step_labels": "builtin", "dataset": "openai/gsm8k"})


PROCESS = {"supervision": "process"}


@pytest.mark.parametrize(
    "spec, key, message",
    [
        (
            {"step_labels": "rollouts"},
            "step_labels",
            "only used with supervision 'process' (got supervision 'outcome')",
        ),
        (
            {"label_rollouts": 8},
            "label_rollouts",
            "only used when steps are labelled by rollouts (supervision "
            "'process', step_labels 'rollouts'), but supervision is 'outcome'",
        ),
        (
            {**PROCESS, "label_estimate": "soft"},
            "label_estimate",
            "but steps are labelled by 'builtin' (step_labels 'auto' on the built-in dataset)",
        ),
        (
            {**PROCESS, "step_labels": "arithmetic", "label_completer": "Qwen/Qwen2.5-Math-7B-Instruct"},
            "label_completer",
            "but steps are labelled by 'arithmetic'",
        ),
        (
            {**PROCESS, "step_labels": "rollouts", "label_completer": "my model"},
            "label_completer",
            "must be a Hugging Face model id or a local directory",
        ),
        ({**PROCESS, "format_reward": 0.1}, "format_reward", "supervision 'process' rewards each step by its label"),
        (
            {
                **PROCESS,
                "dataset": "/data/gsm8k.jsonl",
                "rewards": [{"name": "/data/my_rewards.py:steps", "weight": 1}],
                "label_rollouts": 8,
            },
            "label_rollouts",
            "but the steps are rewarded by the run's rewards",
        ),
        (
            {**PROCESS, "step_labels": "builtin", "dataset": "/data/gsm8k.jsonl"},
            "step_labels",
            "use 'arithmetic' or 'rollouts' (or 'auto')",
        ),
    ],
)
def test_step_label_keys_that_would_do_nothing_are_refused(spec, key, message):
    with pytest.raises(SpecError) as info:
        validate_spec(spec)
    assert info.value.key == key and message in str(info.value)


def test_the_rollout_keys_are_taken_where_steps_are_labelled_by_rollouts():
    spec = validate_spec(
        {
            **PROCESS,
            "step_labels": "rollouts",
            "label_rollouts": 8,
            "label_estimate": "soft",
            "label_completer": "Qwen/Qwen2.5-Math-7B-Instruct",
        }
    )
    assert (spec.step_checker, spec.label_rollouts, spec.label_estimate) == ("rollouts", 8, "soft")
    auto = validate_spec({**PROCESS, "dataset": "/data/gsm8k.jsonl", "label_estimate": "soft"})
    assert (
        auto.step_checker == "rollouts" and auto.label_estimate == "soft"
    )  # 'auto' picks rollouts off the built-in task


def test_8bit_adamw_is_refused_naming_optimizer_where_bitsandbytes_is_missing(monkeypatch):
    """optimizer adamw_8bit needs bitsandbytes on the machine that validates the spec (launch's, then the
    worker's): without it the refusal names the key and what to install; adamw needs nothing."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else real(name, *a)
    )
    with pytest.raises(
        SpecError, match=r"'adamw_8bit' needs bitsandbytes, .*pip install 'grpo-dashboard\[8bit\]'"
    ) as e:
        validate_spec({"optimizer": "adamw_8bit"})
    assert e.value.key == "optimizer"
    assert validate_spec({"optimizer": "adamw"}).optimizer == "adamw"


def test_a_run_as_a_model_is_named_by_its_number_and_only_as_the_policy():
    from grpo_engine.spec.hub import hub_ids

    spec = validate_spec({"model": "run:12"})
    assert spec.model == "run:12" and hub_ids(spec.to_dict()) == []  # not a Hub id to ask the Hub about
    with pytest.raises(SpecError, match="'run:<id>' names a run's trained policy by the run's number") as refused:
        validate_spec({"model": "run:last"})
    assert refused.value.key == "model"
    with pytest.raises(SpecError, match="only model may name a run's trained policy") as refused:
        validate_spec({"label_completer": "run:3", "supervision": "process", "step_labels": "rollouts"})
    assert refused.value.key == "label_completer"
