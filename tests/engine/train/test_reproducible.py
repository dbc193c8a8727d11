"""The same spec and seed give the same run: its metrics and every sampled group depend on the spec alone, not on
what the process did before it (a model built or converted on first use, an earlier run in the same worker) nor on
which run of a dashboard it is. fp32 on the CPU, where the engine is deterministic.

Engine runs of grpo_engine.train.trainer.train on the built-in model (``grpo_cache_dir``), and two launches of one
spec through a live dashboard on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch
from gradio_client import Client

from grpo_engine.data.builtin_task import warmup_examples
from grpo_engine.model import model as model_module
from grpo_engine.model.model import BUILTIN_ARCH, train_from_scratch
from grpo_engine.model.model_cache import build_once
from grpo_engine.report.recorder import MemoryRecorder
from grpo_engine.spec.config import validate_spec
from grpo_engine.train.trainer import train
from tests.support.servers import clean_env, start_server, wait_finished

SPEC = dict(steps_per_iteration=2, batch_size=2, group_size=4, eval_every=2, seed=5, precision="fp32")


def recorded(recorder: MemoryRecorder) -> tuple[list[dict], dict]:
    """What a run recorded, less its timings: the metrics of each step and every group of every step."""
    metrics = [{k: v for k, v in m.items() if not k.startswith("time/")} for m in recorder.metrics]
    groups = {step: [dataclasses.asdict(g) for g in found] for step, found in recorder.group_log.items()}
    return metrics, groups


def run(cache_dir, checkpoint_dir, **overrides) -> tuple[list[dict], dict]:
    recorder = MemoryRecorder()
    result = train(
        validate_spec({**SPEC, **overrides}), recorder, cache_dir, device="cpu", checkpoint_dir=checkpoint_dir
    )
    assert result.status == "completed", recorder.messages[-5:]
    return recorded(recorder)


def quick_build(tmp):
    """The built-in model's build (train_from_scratch under build_once) on a few steps: it seeds and draws."""
    train_from_scratch(tmp, warmup_examples(64, 0.5, 0), BUILTIN_ARCH, steps=3, batch_size=8, lr=1e-3, seed=0)


def test_a_build_leaves_the_random_state_as_it_found_it(tmp_path):
    torch.manual_seed(11)
    expected = torch.rand(4)
    torch.manual_seed(11)
    assert build_once(tmp_path / "model", tmp_path / "model.lock", quick_build, missing="not written")
    assert torch.equal(torch.rand(4), expected)


@pytest.mark.parametrize("overrides", [{}, {"lora_rank": 4, "learning_rate": 1e-3}], ids=["full", "lora"])
def test_a_run_that_built_its_model_records_what_one_that_found_it_cached_does(tmp_path, monkeypatch, overrides):
    """The first run on a fresh cache builds the built-in model while it loads (the build seeds and draws); the
    same spec again, after unrelated draws in the same process (an embedded worker's earlier work), finds it cached:
    both record the same metrics and groups. LoRA too, whose first adapter is drawn from the run's seed. The build
    is the product's, on 3 warm-start steps instead of 900 (a model of its own version), so it takes seconds."""
    monkeypatch.setitem(model_module.WARMUP, "steps", 3)
    monkeypatch.setattr(model_module, "BUILTIN_VERSION", "short-build")
    cache = tmp_path / "cache"
    built = run(cache, tmp_path / "built", **overrides)
    assert (cache / f"{model_module.BUILTIN_MODEL}-short-build" / "model.safetensors").exists()
    torch.rand(1000)
    cached = run(cache, tmp_path / "cached", **overrides)
    assert len(built[0]) == SPEC["steps_per_iteration"] + 1 and len(built[1]) == SPEC["steps_per_iteration"]
    assert cached == built
    other_seed = run(cache, tmp_path / "other", **{**overrides, "seed": 6})
    assert other_seed[1] != built[1]  # the seed does reach the samples: the comparison can fail


def api_records(client: Client, run_id: int) -> tuple[list[dict], list[list[dict]]]:
    """A run's metrics (less timings) and every group's samples, as the API gives them."""
    metrics = [
        {k: v for k, v in m.items() if not k.startswith("time/")}
        for m in client.predict(run_id, api_name="/get_metrics")
    ]
    groups = []
    for step in range(1, SPEC["steps_per_iteration"] + 1):
        for listed in client.predict(run_id, step, "position", api_name="/list_groups"):
            group = client.predict(listed["group_id"], api_name="/get_group")
            groups.append([(s["completion"], s["reward"], s["advantages"], s["logprobs"]) for s in group["samples"]])
    return metrics, groups


@pytest.mark.slow
def test_two_launches_of_one_spec_record_the_same_run(tmp_path, grpo_cache_dir, db_url):
    """Through a live dashboard with its embedded worker, on SQLite and PostgreSQL: the same spec launched twice
    records the same metrics and the same groups."""
    server, url = start_server(tmp_path / "data", clean_env(grpo_cache_dir, GRPO_DATABASE_URL=db_url))
    try:
        client = Client(url, verbose=False)
        records = []
        for _ in range(2):
            run_id = client.predict({**SPEC, "name": "again"}, api_name="/launch_run")["run_id"]
            assert wait_finished(client, run_id, server.log)["status"] == "completed", server.log()[-5000:]
            records.append(api_records(client, run_id))
            time.sleep(0.1)
        assert records[0][1] and records[1] == records[0]
    finally:
        server.stop()
