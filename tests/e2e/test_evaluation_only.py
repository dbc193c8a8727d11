"""Evaluation-only runs and runs as models end to end (`grpo-dashboard serve` with its embedded worker, driven through
gradio_client): the preset "Evaluate a model (no training)" from /list_presets evaluates the built-in model once,
greedy and sampled, and completes with nothing trained (its trained policy is refused by name); a completed run's
trained policy (its evaluations sampled, eval_samples 8, and exported), ``model: run:<id>``, is offered by /list_models and evaluated to the accuracy its run ended with; a
run that does not exist or trained nothing is refused, naming ``model``; every evaluation's questions are kept
(/list_eval_results) and two evaluations compare question by question, across runs too (/compare_evals). (The engine's side:
tests/engine/train/test_sampled_evaluation.py.)"""

from __future__ import annotations

import time

import pandas as pd
import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from grpo_engine.spec.presets import EVALUATE
from tests.support.servers import clean_env, start_server, wait_finished

pytestmark = pytest.mark.slow
SHORT = {"steps_per_iteration": 2, "batch_size": 2, "group_size": 4, "eval_every": 2, "max_new_tokens": 24}


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory, grpo_cache_dir):
    data = tmp_path_factory.mktemp("evaluation") / "data"
    server, url = start_server(data, clean_env(grpo_cache_dir))
    logs = lambda: f"{server.log()}\n--- worker ---\n{(data / 'worker.log').read_text(errors='replace')}"  # noqa: E731
    try:
        yield Client(url, verbose=False), logs
    finally:
        server.stop()


def finished(client, logs, spec: dict) -> tuple[int, dict]:
    run_id = client.predict(spec, api_name="/launch_run")["run_id"]
    run = wait_finished(client, run_id, logs)
    assert run["status"] == "completed", f"{run['error']}\n{logs()}"
    return run_id, run


def test_the_evaluate_preset_runs_through_the_dashboard(dashboard):
    client, logs = dashboard
    (preset,) = [p for p in client.predict(api_name="/list_presets") if p["name"] == EVALUATE]
    spec = {**preset["spec"], "eval_samples": 2, "max_new_tokens": 24}  # the preset's K 8: 1,600 outputs here
    run_id, run = finished(client, logs, spec)
    assert (run["step"], run["total_steps"]) == (0, 0)
    [evaluation] = client.predict(run_id, api_name="/get_metrics")
    assert evaluation["step"] == 0 and 0.0 <= evaluation["eval/pass@1"] <= evaluation["eval/pass@2"] <= 1.0
    with pytest.raises(AppError, match="only evaluated its model"):
        client.predict(run_id, "model", api_name="/export_run")
    with pytest.raises(AppError, match=f"model: run:{run_id} names run {run_id}, which only evaluated its model"):
        client.predict({"model": f"run:{run_id}"}, api_name="/launch_run")


def test_a_runs_trained_policy_is_a_model_for_the_next_run(dashboard):
    client, logs = dashboard
    trained, _ = finished(client, logs, {**SHORT, "name": "trained", "eval_samples": 8})
    assert {"model": f"run:{trained}", "name": "trained"} in client.predict(api_name="/list_models")["runs"]
    again, run = finished(client, logs, {"model": f"run:{trained}", "steps_per_iteration": 0, "max_new_tokens": 24})
    assert run["config"]["model"] == f"run:{trained}"  # the config keeps the run it started from
    last = [m for m in client.predict(trained, api_name="/get_metrics") if "eval/accuracy" in m][-1]
    [evaluation] = client.predict(again, api_name="/get_metrics")
    assert evaluation["eval/accuracy"] == last["eval/accuracy"]  # the same weights, the same greedy answers
    assert 0.0 <= last["eval/maj@8"] <= 1.0 and last["eval/pass@1"] <= last["eval/pass@8"]
    listed = client.predict(trained, None, api_name="/list_eval_results")  # every question of every evaluation
    assert listed["steps"] == [0, 2] and listed["step"] == 2 and len(listed["questions"]) == 200
    right = sum(q["greedy"]["correct"] for q in listed["questions"])
    assert right / 200 == pytest.approx(last["eval/accuracy"])
    same = client.predict(again, 0, trained, 2, "all", "", api_name="/compare_evals")
    assert (same["counts"]["gained"], same["counts"]["lost"], same["counts"]["only first"]) == (0, 0, 0)
    assert all(r["first"]["greedy"] == r["second"]["greedy"] for r in same["rows"])  # word for word
    assert all(len(q["samples"]) == 8 for q in listed["questions"])
    outputs = pd.read_csv(client.predict(trained, "eval-csv", api_name="/export_run"))
    assert len(outputs) == 2 * 200 * 9 and (outputs["output"] == "greedy").sum() == 400  # steps 0 and 2
    moved = client.predict(trained, 0, None, None, "changed", "", api_name="/compare_evals")
    assert moved["second"]["step"] == 2 and sum(moved["counts"].values()) == 200
    with pytest.raises(AppError, match="model: run:99999 names run 99999, which does not exist"):
        client.predict({"model": "run:99999"}, api_name="/launch_run")
    with pytest.raises(AppError, match="model: 'run:<id>' names a run's trained policy by the run's number"):
        client.predict({"model": "run:latest"}, api_name="/launch_run")


def test_a_kept_checkpoint_of_a_cancelled_run_is_a_model(dashboard):
    """``model: run:<id>@<step>``: a cancelled run keeps its newest checkpoints; /list_models offers them, and an
    evaluation of one answers as the run did at that step. A step it does not keep, and any step of a completed
    run, are refused, naming ``model`` and what is kept."""
    client, logs = dashboard
    spec = {**SHORT, "steps_per_iteration": 300, "eval_every": 1, "checkpoint_every": 1, "name": "cancelled"}
    run_id = client.predict(spec, api_name="/launch_run")["run_id"]
    deadline = time.monotonic() + 300
    while client.predict(run_id, api_name="/get_run")["step"] < 2:
        assert time.monotonic() < deadline, logs()
        time.sleep(0.5)
    client.predict(run_id, api_name="/cancel_run")
    assert wait_finished(client, run_id, logs)["status"] == "cancelled"
    runs = client.predict(api_name="/list_models")["runs"]
    offered = [m for m in runs if m["model"].startswith(f"run:{run_id}@")]
    assert len(offered) == 2 and offered[-1]["name"] == "cancelled"  # checkpoint_keep 2
    step = int(offered[-1]["model"].rpartition("@")[2])
    again, run = finished(client, logs, {"model": offered[-1]["model"], "steps_per_iteration": 0, "max_new_tokens": 24})
    assert run["config"]["model"] == f"run:{run_id}@{step}"
    [at] = [m for m in client.predict(run_id, api_name="/get_metrics") if m["step"] == step and "eval/accuracy" in m]
    [evaluation] = client.predict(again, api_name="/get_metrics")
    assert evaluation["eval/accuracy"] == at["eval/accuracy"]  # the checkpoint's weights, the same greedy answers
    with pytest.raises(
        AppError, match=rf"model: run:{run_id}@0: run {run_id} keeps no checkpoint of step 0 \(it keeps"
    ):
        client.predict({"model": f"run:{run_id}@0"}, api_name="/launch_run")
    done, _ = finished(client, logs, {**SHORT, "checkpoint_every": 1})
    with pytest.raises(AppError, match=f"a completed run keeps none: run:{done} is its trained policy"):
        client.predict({"model": f"run:{done}@2"}, api_name="/launch_run")
