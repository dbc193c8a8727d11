"""The Launch form's layout (app.web.views.launch_form): every run-spec key appears once, the presets are valid run specs,
and the rules that hide keys follow the options they depend on."""

from __future__ import annotations

import json

import pytest

from app.web.views.launch_form import APPLIES, DECIDING, SECTIONS, applies, label, preset_values, section_of
from grpo_engine.spec.config import FIELDS, validate_spec
from grpo_engine.spec.presets import PRESETS
from grpo_engine.spec.words import SpecError
from tests.support.files import FILE


def test_every_key_sits_in_exactly_one_section():
    placed = [k for s in SECTIONS for k in (*s.essential, *s.more)]
    assert sorted(placed) == sorted(f.name for f in FIELDS)
    assert len(placed) == len(set(placed))
    assert all(0 <= section_of(k) < len(SECTIONS) for k in placed)


@pytest.mark.parametrize("preset", list(PRESETS))
def test_each_preset_is_a_valid_run_spec(preset):
    values = dict(zip((f.name for f in FIELDS), preset_values(preset), strict=True))
    spec = validate_spec(values)
    for key, value in PRESETS[preset].items():
        assert getattr(spec, key) == value


def test_keys_apply_only_under_their_options():
    rule, model = {"reward": "rule", "supervision": "outcome"}, {"reward": "model", "supervision": "process"}
    assert not applies("rm_samples", rule) and applies("rm_samples", model)
    assert not applies("rm_data", {"reward": "model", "supervision": "outcome"}) and applies("rm_data", model)
    assert applies("format_reward", rule) and not applies("format_reward", model)
    assert applies("step_delimiter", model) and not applies("step_delimiter", rule)
    assert not applies("dataset_split", {"dataset": "builtin-arith"}) and applies(
        "dataset_split", {"dataset": "openai/gsm8k"}
    )
    assert not applies("question_field", {"dataset": "builtin-word-problems"})
    assert all(applies(f.name, {}) for f in FIELDS if f.name not in APPLIES)
    assert set(DECIDING) <= {f.name for f in FIELDS}


def test_labels_show_words_and_the_key():
    assert label("kl_coef") == "KL coefficient beta · kl_coef"
    assert label("temperature") == "Temperature · temperature"


def test_rollout_keys_apply_only_when_steps_are_labelled_by_rollouts():
    process = {"supervision": "process", "dataset": "builtin-arith"}
    assert not applies("label_rollouts", process)  # auto on the built-in task: its exact checker
    assert applies("label_rollouts", {**process, "step_labels": "rollouts"})
    assert applies("label_estimate", {**process, "dataset": "/data/gsm8k.jsonl"})  # auto elsewhere: rollouts
    assert not applies("label_estimate", {**process, "dataset": "/data/gsm8k.jsonl", "step_labels": "arithmetic"})
    assert not applies("label_rollouts", {"supervision": "outcome", "step_labels": "rollouts"})


def test_hugging_face_keys_apply_to_hub_datasets_and_columns_to_every_dataset_but_the_built_in_one():
    for dataset, hub, columns in (
        ("builtin-arith", False, False),
        ("/srv/data/gsm8k.jsonl", False, True),
        ("uploads/train.CSV", False, True),
        ("openai/gsm8k", True, True),
    ):
        values = {"dataset": dataset}
        assert [applies(k, values) for k in ("dataset_config", "dataset_split", "eval_split")] == [hub] * 3, dataset
        assert [applies(k, values) for k in ("question_field", "answer_field")] == [columns] * 2, dataset


def test_more_options_is_shown_only_where_a_key_under_it_applies():
    from app.web.tabs.launch import _visibility

    def folds(**values):
        updates = _visibility(*[values.get(k, "") for k in DECIDING])[-len(SECTIONS) :]
        return {section.title: update["visible"] for section, update in zip(SECTIONS, updates, strict=True)}

    built_in = folds(dataset="builtin-arith", supervision="outcome", reward="rule")
    assert built_in == {"Model & data": False, "Algorithm": True, "Reward": False, "Runtime & saving": True}
    assert folds(dataset="a.jsonl", supervision="process", reward="rule")["Model & data"]
    assert folds(dataset="builtin-arith", supervision="process", reward="rule")["Reward"]
    assert folds(dataset="builtin-arith", supervision="outcome", reward="model")["Reward"]


# For each key that only some runs read: a value other than its default, valid on its own.
OTHER = {
    "dataset_config": "main",
    "dataset_split": "test",
    "eval_split": "test",
    "question_field": "problem",
    "answer_field": "solution_text",
    "solution_field": "worked",
    "format_reward": 0.5,
    "step_delimiter": "|",
    "label_rollouts": 8,
    "label_estimate": "soft",
    "label_completer": "builtin-arith",
    "reward_model": "builtin-arith",
    "rm_data": "/data/prm.jsonl",
    "rm_samples": 64,
    "rm_learning_rate": 3e-4,
    "rm_replay_ratio": 0.5,
    "max_resample": 3,
    "overlong_buffer": 16,
    "sharding": "fsdp",
    "eval_samples": 4,
    "eval_temperature": 1.0,
}
# the keys deciding whether others apply that are not looped over one by one: each choice varies one of them
VARIED = (
    {"overlong_penalty": 0.0, "devices": 1, "eval_every": 10, "eval_samples": 0},
    {"overlong_penalty": 0.5, "devices": 1, "eval_every": 10, "eval_samples": 0},
    {"overlong_penalty": 0.0, "devices": 2, "eval_every": 10, "eval_samples": 0},
    {"overlong_penalty": 0.0, "devices": 1, "eval_every": 0, "eval_samples": 0},
    {"overlong_penalty": 0.0, "devices": 1, "eval_every": 10, "eval_samples": 4},
)
DEFAULT = {f.name: f.default for f in FIELDS}


def _accepted(spec: dict, key: str) -> bool:
    """Whether launch's validator takes ``spec``; a refusal must name ``key``."""
    try:
        validate_spec(spec)
        return True
    except SpecError as e:
        assert e.key == key, (key, spec, str(e))
        return False


@pytest.mark.parametrize("dataset", ["builtin-arith", "/data/train.jsonl", "openai/gsm8k"])
@pytest.mark.parametrize("supervision", ["outcome", "process"])
@pytest.mark.parametrize("reward", ["rule", "model"])
def test_the_form_shows_a_key_exactly_when_launch_accepts_it(dataset, supervision, reward, tmp_path):
    """Every key with a rule, over every choice of the keys its rule reads: the form shows it exactly when
    validate_spec accepts a value other than its default. (The form once showed label_rollouts with process
    supervision, step_labels 'rollouts' and named rewards, which reward the steps themselves; Launch refused it.)"""
    assert set(OTHER) | {"rewards", "step_labels"} == set(APPLIES)
    assert all(OTHER[k] != DEFAULT[k] for k in OTHER)
    (tmp_path / "file_rewards.py").write_text(FILE)
    named = [{"name": f"{tmp_path / 'file_rewards.py'}:equations", "weight": 1.0}]
    for rewards in ([], named):
        for step_labels in ("auto", "rollouts", "arithmetic"):
            for skip_zero_spread in (False, True):
                for varied in VARIED:
                    spec = {
                        "dataset": dataset,
                        "supervision": supervision,
                        "reward": reward,
                        "rewards": rewards,
                        "step_labels": step_labels,
                        "skip_zero_spread": skip_zero_spread,
                        **varied,
                    }
                    form = {**spec, "rewards": json.dumps(rewards)}  # the form's box holds the JSON list
                    try:
                        validate_spec(spec)
                    except SpecError as e:  # a deciding key given where it is not read: the form hides it
                        assert e.key in ("rewards", "step_labels") and not applies(e.key, form), (spec, str(e))
                        continue
                    assert applies("rewards", form) or not rewards
                    assert applies("step_labels", form) or step_labels == "auto"
                    for key, value in OTHER.items():
                        assert applies(key, form) == _accepted({**spec, key: value}, key), (key, spec)
