"""Evaluation-only runs end to end (`grpo-dashboard serve` with its embedded worker, driven through gradio_client):
the preset "Evaluate a model (no training)" from /list_presets evaluates the built-in model once, greedy and sampled,
and completes with nothing trained; its trained policy is refused by name. And in the engine: what such a run
records, loads and saves, and the run spec's refusals."""

from __future__ import annotations

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from grpo_engine.report.recorder import EVAL_METRICS, MemoryRecorder
from grpo_engine.rewards.sampled_eval import ks_up_to
from grpo_engine.spec.config import SpecError, validate_spec
from grpo_engine.spec.presets import EVALUATE
from grpo_engine.train.trainer import train
from tests.support.servers import clean_env, start_server, wait_finished


class PhaseRecorder(MemoryRecorder):
    def __init__(self) -> None:
        super().__init__()
        self.phases: list[str] = []

    def phase(self, name: str, done: int | None = None, total: int | None = None) -> None:
        self.phases.append(name)


def test_an_evaluation_only_run_evaluates_once_and_saves_nothing(grpo_cache_dir, tmp_path):
    recorder = PhaseRecorder()
    spec = validate_spec({"steps_per_iteration": 0, "eval_samples": 4, "max_new_tokens": 24})
    result = train(spec, recorder, grpo_cache_dir, device="cpu", checkpoint_dir=tmp_path / "run")
    assert (result.status, result.step, recorder.total_steps) == ("completed", 0, 0)
    [evaluation] = recorder.metrics
    assert evaluation["step"] == 0 and set(EVAL_METRICS) <= set(evaluation)
    assert {f"eval/pass@{k}" for k in ks_up_to(4)} <= set(evaluation)
    assert {"step": 0, "iteration": 0, **result.metrics} == evaluation
    assert not (tmp_path / "run" / "final").exists()  # nothing trained, nothing saved
    assert any("nothing trained" in line for line in recorder.messages)
    assert "evaluating" in recorder.phases and "training" not in recorder.phases


@pytest.mark.parametrize(
    ("spec", "key", "words"),
    [
        ({"eval_every": 0}, "eval_every", "must be more than 0 when steps_per_iteration is 0"),
        ({"iterations": 2}, "iterations", "must be 1 when steps_per_iteration is 0"),
        ({"reward": "model"}, "reward", "'model' trains a reward model"),
    ],
)
def test_an_evaluation_only_spec_refuses_what_it_cannot_do(spec, key, words):
    with pytest.raises(SpecError, match=words) as refused:
        validate_spec({"steps_per_iteration": 0, **spec})
    assert refused.value.key == key
    assert validate_spec({"steps_per_iteration": 0, "lr_warmup_steps": 0}).total_steps == 0


@pytest.mark.slow
def test_the_evaluate_preset_runs_through_the_dashboard(tmp_path, grpo_cache_dir):
    server, url = start_server(tmp_path / "data", clean_env(grpo_cache_dir))
    worker_log = tmp_path / "data" / "worker.log"
    logs = lambda: f"{server.log()}\n--- worker ---\n{worker_log.read_text(errors='replace')}"  # noqa: E731
    try:
        client = Client(url, verbose=False)
        (preset,) = [p for p in client.predict(api_name="/list_presets") if p["name"] == EVALUATE]
        spec = {**preset["spec"], "eval_samples": 2, "max_new_tokens": 24}  # the preset's K 8: 1,600 outputs here
        run_id = client.predict(spec, api_name="/launch_run")["run_id"]
        run = wait_finished(client, run_id, logs)
        assert run["status"] == "completed", f"{run['error']}\n{logs()}"
        assert (run["step"], run["total_steps"]) == (0, 0)
        [evaluation] = client.predict(run_id, api_name="/get_metrics")
        assert evaluation["step"] == 0 and 0.0 <= evaluation["eval/pass@2"] <= 1.0
        assert evaluation["eval/pass@1"] <= evaluation["eval/pass@2"]
        with pytest.raises(AppError, match="only evaluated its model"):
            client.predict(run_id, "model", api_name="/export_run")
    finally:
        server.stop()
