"""Evaluation-only runs end to end (`grpo-dashboard serve` with its embedded worker, driven through gradio_client):
the preset "Evaluate a model (no training)" from /list_presets evaluates the built-in model once, greedy and sampled,
and completes with nothing trained; its trained policy is refused by name. (The engine's side:
tests/engine/train/test_sampled_evaluation.py.)"""

from __future__ import annotations

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from grpo_engine.spec.presets import EVALUATE
from tests.support.servers import clean_env, start_server, wait_finished


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
