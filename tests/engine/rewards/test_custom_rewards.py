"""Custom reward functions: from an installed package's entry point (a temporary package with a dist-info) or a .py
file inside the path roots; off unless GRPO_ALLOW_CUSTOM_REWARDS is set; a failing one fails the run with its own
error. Then live: short runs through a dashboard with its embedded worker, and /preview_rewards."""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from app.core.paths import check_custom_rewards
from app.service import api, previews
from grpo_engine.rewards.reward_functions import (
    RewardFunctionError,
    call_reward,
    load_reward,
    named_rewards,
    score_outputs,
)
from grpo_engine.spec.config import SpecError, validate_spec
from tests.support.files import FILE

PACKAGE = '''
CALLS = [0]


def brevity(question, completion, reference, **row):
    """1.0 for a right answer of at most 20 characters, 0.5 for a longer right one, else 0."""
    return (1.0 if len(completion) <= 20 else 0.5) if row["correct"] else 0.0


def flaky(question, completion, reference, **row):
    """0.0 for the first 8 outputs (step 1 of a B 2 x G 4 run), then raises."""
    CALLS[0] += 1
    if CALLS[0] > 8:
        raise ValueError("boom at call %d" % CALLS[0])
    return 0.0
'''


def make_package(where: Path) -> Path:
    """A package ``my_rewards`` with a dist-info declaring brevity and flaky in grpo_dashboard.rewards."""
    (where / "my_rewards").mkdir(parents=True)
    (where / "my_rewards" / "__init__.py").write_text(PACKAGE)
    info = where / "my_rewards-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my_rewards\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[grpo_dashboard.rewards]\nbrevity = my_rewards:brevity\nflaky = my_rewards:flaky\n"
    )
    return where


@pytest.fixture
def package(tmp_path, monkeypatch):
    """The temporary package, importable in this process."""
    monkeypatch.syspath_prepend(str(make_package(tmp_path / "site")))
    importlib.invalidate_caches()
    yield
    sys.modules.pop("my_rewards", None)


def test_an_entry_point_loads_by_its_name_or_its_value(package):
    assert load_reward("brevity") is load_reward("my_rewards:brevity")
    out = {"question": "q", "completion": "#### 14", "reference": "14", "row": {"correct": 1.0}}
    assert score_outputs([{"name": "brevity", "weight": 2.0}], [out])[0] == (2.0, {"brevity": 1.0})
    assert validate_spec({"rewards": [{"name": "brevity"}]}).rewards == [{"name": "brevity", "weight": 1.0}]


def test_a_file_reward_scores_outcome_and_process(tmp_path):
    path = tmp_path / "file_rewards.py"
    path.write_text(FILE)
    out = {
        "question": "q",
        "completion": "2+3=5\nso\n#### 5",
        "reference": "5",
        "row": {"steps": ["2+3=5", "so", "#### 5"]},
    }
    # 4 words ("2+3=5", "so", "####", "5") x 0.5
    assert score_outputs([{"name": f"{path}:words", "weight": 0.5}], [out])[0] == (2.0, {f"{path}:words": 4.0})
    total, parts = score_outputs([{"name": f"{path}:equations", "weight": 2.0}], [out], process=True)[0]
    assert total == [2.0, 0.0, 0.0] and parts == {f"{path}:equations": pytest.approx(1 / 3)}


def test_process_rewards_replace_the_step_labels(tmp_path):
    path = tmp_path / "file_rewards.py"
    path.write_text(FILE)
    spec = validate_spec({"supervision": "process", "rewards": [{"name": f"{path}:equations", "weight": 0.5}]})

    class Judged:
        texts = ["3*4=12\n#### 14"]
        outcome = [(1.0, {"correct": 1.0, "formatted": 1.0})]
        steps = [["3*4=12", "#### 14"]]
        verdicts = [[1.0, 1.0]]

    outcome, steps = named_rewards(spec, Judged, [{"question": "2+3*4", "answer": "14", "solution": ""}], [9])
    assert steps == [[0.5, 0.0]] and outcome[0][1] == {"correct": 1.0, "formatted": 1.0, f"{path}:equations": 0.5}


def test_a_failing_reward_says_which_and_on_what(tmp_path):
    path = tmp_path / "file_rewards.py"
    path.write_text(FILE)
    bad = load_reward(f"{path}:not_a_number")
    with pytest.raises(
        RewardFunctionError,
        match=r"reward 'bad' returned 'high' \(str\), not a finite number, on "
        r"question 'q' with completion 'x{200}\.\.\.'",
    ):
        call_reward("bad", bad, "q", "x" * 500, "1", row={})
    with pytest.raises(RewardFunctionError, match="reward 'boom' raised ZeroDivisionError: division by zero on "):
        call_reward("boom", lambda q, c, r, **row: 1 / 0, "q", "c", "1", row={})
    with pytest.raises(RewardFunctionError, match="returned 1 step rewards for an output of 2 steps"):
        call_reward("steps", lambda q, c, r, **row: [1.0], "q", "c", "1", row={}, steps=2)
    with pytest.raises(RewardFunctionError, match="not a finite number"):
        call_reward("nan", lambda q, c, r, **row: float("nan"), "q", "c", "1", row={})


def test_custom_rewards_need_the_switch_a_declaration_and_a_file_inside_the_roots(tmp_path, package):
    inside, outside = tmp_path / "roots", tmp_path / "elsewhere"
    inside.mkdir()
    outside.mkdir()
    (inside / "r.py").write_text(FILE)
    (outside / "r.py").write_text(FILE)
    config = {"rewards": [{"name": "brevity", "weight": 1.0}]}
    with pytest.raises(SpecError, match="rewards: 'brevity' is a custom reward function.*GRPO_ALLOW_CUSTOM_REWARDS=1"):
        check_custom_rewards(config, [inside], allowed=False)
    check_custom_rewards(config, [inside], allowed=True)
    check_custom_rewards({"rewards": [{"name": "accuracy", "weight": 1.0}]}, [inside], allowed=False)
    with pytest.raises(SpecError, match="rewards: 'os:system' is not declared by any installed package"):
        check_custom_rewards({"rewards": [{"name": "os:system", "weight": 1.0}]}, [inside], allowed=True)
    with pytest.raises(SpecError, match="rewards: .* is outside the directories runs may read"):
        check_custom_rewards({"rewards": [{"name": f"{outside / 'r.py'}:words"}]}, [inside], allowed=True)
    check_custom_rewards({"rewards": [{"name": f"{inside / 'r.py'}:words"}]}, [inside], allowed=True)


def test_launch_refuses_custom_rewards_without_the_switch(settings_env, package):
    refused = "rewards: 'my_rewards:brevity' is a custom reward.*GRPO_ALLOW_CUSTOM_REWARDS"
    with pytest.raises(api.ApiError, match=refused):
        api.launch_run({"rewards": [{"name": "my_rewards:brevity"}]})


def test_preview_scores_the_first_rows_in_a_subprocess(settings_env, monkeypatch):
    result = previews.preview_rewards({"rewards": [{"name": "accuracy"}, {"name": "format", "weight": 0.5}]})
    assert result["names"] == ["accuracy", "format"] and result["weights"] == {"accuracy": 1.0, "format": 0.5}
    assert len(result["rows"]) == 5
    for row in result["rows"]:  # the built-in task's reference solutions are right and end in '#### <answer>'
        assert row["components"] == {"accuracy": 1.0, "format": 1.0} and row["reward"] == 1.5
    page = previews.preview_html(result)
    assert "accuracy × 1" in page and "format × 0.5" in page and page.count("<tr>") == 6
    with pytest.raises(api.ApiError, match="rewards: is empty"):
        previews.preview_rewards({})
    path = settings_env / "data" / "file_rewards.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(FILE)
    with pytest.raises(api.ApiError, match="GRPO_ALLOW_CUSTOM_REWARDS"):
        previews.preview_rewards({"rewards": [{"name": f"{path}:words"}]})
    monkeypatch.setenv("GRPO_ALLOW_CUSTOM_REWARDS", "1")
    with pytest.raises(api.ApiError, match=r"rewards: reward '.*:not_a_number' returned 'high' \(str\)"):
        previews.preview_rewards({"rewards": [{"name": f"{path}:not_a_number"}]})


# ---- live: a dashboard with its embedded worker --------------------------------------------------

SHORT = {"batch_size": 2, "group_size": 4, "steps_per_iteration": 2, "eval_every": 0, "checkpoint_every": 0}


def _run(client: Client, spec: dict, logs) -> tuple[int, dict]:
    from tests.support.servers import wait_finished

    run_id = client.predict({**SHORT, **spec}, api_name="/launch_run")["run_id"]
    return run_id, wait_finished(client, run_id, logs)


def _components(client: Client, run_id: int) -> list[dict]:
    groups = client.predict(run_id, None, None, api_name="/list_groups")
    return [
        s["reward_components"] for g in groups for s in client.predict(g["group_id"], api_name="/get_group")["samples"]
    ]


@pytest.mark.slow
def test_custom_rewards_train_through_a_live_dashboard(tmp_path, grpo_cache_dir):
    from tests.support.servers import clean_env, start_server

    site = make_package(tmp_path / "site")
    data = tmp_path / "data"
    data.mkdir()
    (data / "file_rewards.py").write_text(FILE)
    env = clean_env(grpo_cache_dir, GRPO_ALLOW_CUSTOM_REWARDS="1")
    env["PYTHONPATH"] = f"{site}:{env['PYTHONPATH']}" if env.get("PYTHONPATH") else str(site)
    server, url = start_server(data, env)
    try:
        client = Client(url, verbose=False)
        logs = server.log
        # 1. an entry point by its value, beside a built-in: the components hold both, the reward their weighted sum
        run_id, run = _run(
            client,
            {"rewards": [{"name": "my_rewards:brevity", "weight": 2.0}, {"name": "accuracy", "weight": 1.0}]},
            logs,
        )
        assert run["status"] == "completed", f"{run['error']}\n{logs()}"
        metrics = client.predict(run_id, api_name="/get_metrics")
        assert all("reward/my_rewards:brevity" in m and "reward/accuracy" in m for m in metrics)
        groups = client.predict(run_id, None, None, api_name="/list_groups")
        group = client.predict(groups[0]["group_id"], api_name="/get_group")
        assert group["reward_weights"] == {"my_rewards:brevity": 2.0, "accuracy": 1.0}
        for sample in group["samples"]:
            parts = sample["reward_components"]
            assert "correct" in parts and parts["accuracy"] == parts["correct"]
            assert sample["reward"] == pytest.approx(2.0 * parts["my_rewards:brevity"] + parts["accuracy"])
        # 2. a file inside the roots, process supervision: one reward per step
        name = f"{data / 'file_rewards.py'}:equations"
        run_id, run = _run(client, {"supervision": "process", "rewards": [{"name": name, "weight": 1.0}]}, logs)
        assert run["status"] == "completed", f"{run['error']}\n{logs()}"
        assert all(name in parts for parts in _components(client, run_id))
        # 3. a reward that raises at step 2: the run fails with its error; step 1's metrics and groups stay
        run_id, run = _run(client, {"rewards": [{"name": "flaky", "weight": 1.0}]}, logs)
        assert run["status"] == "failed" and "reward 'flaky' raised ValueError: boom at call 9" in run["error"]
        assert "on question '" in run["error"] and "with completion '" in run["error"]
        assert [m["step"] for m in client.predict(run_id, api_name="/get_metrics")] == [1]
        assert client.predict(run_id, 1, None, api_name="/list_groups")
        # 4. the preview endpoint, with the package's reward
        preview = client.predict({"rewards": [{"name": "brevity", "weight": 1.0}]}, api_name="/preview_rewards")
        assert preview["names"] == ["brevity"] and len(preview["rows"]) == 5
        assert all(row["components"]["brevity"] in (0.5, 1.0) for row in preview["rows"])
    finally:
        server.stop()


@pytest.mark.slow
def test_custom_rewards_are_refused_by_a_dashboard_without_the_switch(tmp_path, grpo_cache_dir):
    from tests.support.servers import clean_env, start_server

    data = tmp_path / "data"
    data.mkdir()
    (data / "file_rewards.py").write_text(textwrap.dedent(FILE))
    server, url = start_server(data, clean_env(grpo_cache_dir))
    try:
        client = Client(url, verbose=False)
        with pytest.raises(AppError, match="rewards: .* is a custom reward function.*GRPO_ALLOW_CUSTOM_REWARDS=1"):
            client.predict(
                {**SHORT, "rewards": [{"name": f"{data / 'file_rewards.py'}:words"}]}, api_name="/launch_run"
            )
        assert client.predict(api_name="/list_runs") == []
    finally:
        server.stop()
