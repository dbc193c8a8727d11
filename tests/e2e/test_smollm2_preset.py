"""The CPU preset for a small instruct model, from the form alone: SmolLM2-135M-Instruct (GRPO_TEST_SMOLLM2, as in
tests/engine/model/test_smollm2.py, skipped where it is unset) put in a live dashboard's models folder and trained with the preset
"Small instruct model on word problems (CPU)". A file of its own, so that a parallel test run schedules it beside
tests/engine/model/test_smollm2.py rather than after it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from gradio_client import Client

from tests.support.servers import clean_env, start_server, wait_finished

PRESET_STEPS = 1  # steps the preset's run makes before the test cancels it (the preset trains 40)
PRESET_TIMEOUT = 600  # seconds for the .gguf file's conversion and PRESET_STEPS steps of 32 outputs
READINGS = {"gsm8k", "boxed", "number", "none"}


@pytest.mark.slow
def test_the_cpu_preset_runs_from_the_models_folder_and_every_card_names_its_reading(tmp_path, smollm2_file):
    """A new user's path: the .gguf file put in the data directory's models folder (no GRPO_PATH_ROOTS, no custom
    code, no restart), the preset "Small instruct model on word problems (CPU)" from /list_presets with its model
    swapped, launched through gradio_client; after a step every sample of /get_group says which answer the
    verifier read and by which rule, and carries each named reward's value. Its held-out evaluations are off
    (eval_every 0): 110 greedy answers at step 0 were most of the test's time, and step 0's evaluation is tested
    on the other models (tests/engine/model/test_real_models.py)."""
    import shutil
    import time

    data_dir = tmp_path / "data"
    server, url = start_server(data_dir, clean_env(tmp_path / "cache"))  # a cache of its own: the copy converts once
    try:
        client = Client(url, verbose=False)
        local = data_dir / "models" / smollm2_file.name
        shutil.copy2(smollm2_file, local)  # the models folder exists from the start; a file copied in is offered
        offered = client.predict(api_name="/list_models")
        assert [m for m in offered["local"] if m["kind"] == "gguf" and Path(m["model"]) == local], offered
        (preset,) = [p for p in client.predict(api_name="/list_presets") if "word problems (CPU)" in p["name"]]
        spec = {**preset["spec"], "model": str(local), "eval_every": 0}
        run_id = client.predict(spec, api_name="/launch_run")["run_id"]
        deadline = time.monotonic() + PRESET_TIMEOUT
        # asked to cancel once it trains: the step under way then is its last (a cancel is heeded between steps)
        while (run := client.predict(run_id, api_name="/get_run"))["phase"] != "training" and run["step"] < 1:
            assert run["status"] in ("queued", "running"), f"{run['error']}\n{server.log()[-5000:]}"
            assert time.monotonic() < deadline, f"not training in {PRESET_TIMEOUT} s: {run}"
            time.sleep(1)
        client.predict(run_id, api_name="/cancel_run")
        run = wait_finished(client, run_id, server.log, PRESET_TIMEOUT)
        assert run["status"] == "cancelled" and run["step"] >= PRESET_STEPS, f"{run}\n{server.log()[-5000:]}"
        assert client.predict(run_id, api_name="/get_metrics")[0]["step"] == 1
        groups = [
            client.predict(g["group_id"], api_name="/get_group")
            for g in client.predict(run_id, 1, "position", api_name="/list_groups")
        ]
        assert len(groups) == 4 and all(len(g["samples"]) == 8 for g in groups)
        for group in groups:
            for sample in group["samples"]:
                assert sample["answer_rule"] in READINGS, sample
                assert (sample["answer"] is None) == (sample["answer_rule"] == "none"), sample
                parts = sample["reward_components"]
                assert {"accuracy", "strict_correct", "format_after_working"} <= set(parts), parts
                weights = {r["name"]: r["weight"] for r in preset["spec"]["rewards"]}
                weighted = sum(weights[name] * parts[name] for name in weights)
                assert sample["reward"] == pytest.approx(weighted), sample
                assert parts["strict_correct"] <= parts["accuracy"]  # a strict right answer is a right answer
    finally:
        server.stop()
