"""Try a question end to end (`grpo-dashboard serve` with its embedded workers, driven through gradio_client): a run
trains; /list_try_options offers its starting model, its trained policy and its held-out questions; /try_question
samples G outputs of both on the tries worker, each read by the verifier and scored by the run's rewards, each
token with its log-prob; the same seed gives the same outputs; a bad request is refused naming its field."""

from __future__ import annotations

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from grpo_engine.rewards.rewards import FORM_WORDS
from tests.support.servers import clean_env, start_server, wait_finished

pytestmark = pytest.mark.slow
SHORT = {"steps_per_iteration": 2, "batch_size": 2, "group_size": 4, "eval_every": 2, "max_new_tokens": 24,
         "format_reward": 0.1}  # fmt: skip


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory, grpo_cache_dir):
    data = tmp_path_factory.mktemp("tries") / "data"
    server, url = start_server(data, clean_env(grpo_cache_dir))

    def logs() -> str:
        workers = [(data / name).read_text(errors="replace") for name in ("worker.log", "tries.log")]
        return f"{server.log()}\n--- worker ---\n{workers[0]}\n--- tries ---\n{workers[1]}"

    try:
        yield Client(url, verbose=False), logs
    finally:
        server.stop()


def test_a_question_tried_on_a_runs_starting_model_and_trained_policy(dashboard):
    client, logs = dashboard
    run_id = client.predict(SHORT, api_name="/launch_run")["run_id"]
    assert wait_finished(client, run_id, logs)["status"] == "completed", logs()
    options = client.predict(run_id, api_name="/list_try_options")
    assert [m["model"] for m in options["models"]] == ["start", "final"]
    assert options["models"][0]["label"] == "starting model (builtin-arith)"
    picked = options["questions"][0]
    assert picked["split"] == "held-out" and len(options["questions"]) == 50
    request = {"run_id": run_id, "question": picked["question"], "models": ["start", "final"],
               "reference": picked["reference"], "g": 4, "max_new_tokens": 24, "seed": 3}  # fmt: skip
    tried = client.predict(**request, api_name="/try_question")
    assert [m["model"] for m in tried["models"]] == ["start", "final"] and tried["reward_weights"] == {}
    for model in tried["models"]:
        assert len(model["outputs"]) == 4 and model["seconds"] > 0
        for out in model["outputs"]:
            assert len(out["tokens"]) == len(out["logprobs"]) == len(out["token_ids"]) <= 24
            assert all(v <= 0 for v in out["logprobs"])
            assert out["answer_rule"] in FORM_WORDS and out["components"]["correct"] in (0.0, 1.0)
            parts = out["components"]
            assert out["reward"] == pytest.approx(parts["correct"] + parts["format"])  # the run's rewards
    again = client.predict(**request, api_name="/try_question")
    assert [m["outputs"] for m in again["models"]] == [m["outputs"] for m in tried["models"]]  # the seed's outputs
    with pytest.raises(AppError, match="g: 40 is out of bounds; a try takes 1 to 16"):
        client.predict(**{**request, "g": 40}, api_name="/try_question")
    with pytest.raises(AppError, match=f"models: run {run_id} has no model '7' to try; it offers start, final"):
        client.predict(**{**request, "models": ["7"]}, api_name="/try_question")
