"""app.core.admission.admit: the one admission of a run, called at launch and on the worker, each with its own
machine's settings. A worker whose settings are stricter refuses what the dashboard let through; launch's own
placement check runs inside it; no other module repeats its checks."""

from __future__ import annotations

import ast
import dataclasses

import pytest

from app.core.admission import admit
from app.core.settings import get_settings
from grpo_engine.spec.config import RunSpec, SpecError
from tests.support.servers import ROOT

CHECKS = {"validate_spec", "check_budget", "check_spec_paths", "check_custom_rewards", "check_hub_ids"}


@pytest.fixture
def settings(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_DATA_DIR", str(tmp_path))
    return dataclasses.replace(get_settings(), hub_check_seconds=0)


def test_a_spec_is_admitted_as_a_run_spec_with_its_defaults(settings):
    spec = admit({"group_size": 4}, settings)
    assert isinstance(spec, RunSpec) and spec.group_size == 4 and spec.model == "builtin-arith"


def test_a_worker_with_a_smaller_budget_refuses_what_launch_admitted(settings):
    spec = {"batch_size": 8, "group_size": 8, "max_new_tokens": 64}  # 4,096 tokens a step
    admit(spec, settings)
    with pytest.raises(SpecError, match="4,096 tokens a step, more than this dashboard's budget of 4,000"):
        admit(spec, dataclasses.replace(settings, max_tokens_per_step=4000))


def test_a_worker_with_other_roots_refuses_a_local_dataset_outside_them(settings, tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text('{"question": "1+1", "answer": "2"}\n{"question": "2+2", "answer": "4"}\n')
    admit({"dataset": str(data)}, settings)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with pytest.raises(SpecError, match="^dataset: "):
        admit({"dataset": str(data)}, dataclasses.replace(settings, path_roots=(elsewhere,)))


def test_custom_rewards_need_the_switch_where_the_check_runs(settings, tmp_path):
    (tmp_path / "r.py").write_text("def words(question, completion, reference, **row):\n    return 1.0\n")
    spec = {"rewards": [{"name": f"{tmp_path / 'r.py'}:words", "weight": 1.0}]}
    with pytest.raises(SpecError, match="^rewards: .*GRPO_ALLOW_CUSTOM_REWARDS"):
        admit(spec, settings)
    admit(spec, dataclasses.replace(settings, allow_custom_rewards=True))


def test_the_placement_check_sees_the_validated_config_and_its_refusal_stands(settings):
    seen = []

    def placement(config: dict) -> None:
        seen.append(config)
        raise SpecError("device", "no live worker has a GPU")

    with pytest.raises(SpecError, match="^device: no live worker has a GPU$"):
        admit({"device": "gpu"}, settings, placement=placement)
    assert seen[0]["device"] == "gpu" and seen[0]["group_size"] == RunSpec().group_size  # every key, defaults in


@pytest.mark.parametrize("path", ["app/service/api.py", "workers/runner.py"])
def test_launch_and_the_worker_call_admit_and_repeat_none_of_its_checks(path):
    calls = {
        node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
        for node in ast.walk(ast.parse((ROOT / path).read_text(encoding="utf-8")))
        if isinstance(node, ast.Call)
    }
    assert "admit" in calls
    assert not calls & (CHECKS - {"validate_spec"}), calls & CHECKS
