"""End to end: the real `grpo-dashboard` processes, driven only through gradio_client.

Embedded default: `grpo-dashboard serve` with its SQLite store, SQLite broker and embedded worker.
Production shape: the same server on PostgreSQL and Redis with no embedded worker, plus a separate
`grpo-dashboard worker` process. In both, a short run on the built-in model and dataset is launched
with /launch_run and must complete; its metrics, groups and per-token advantages are then read
back through the API and checked against the GRPO definitions (outcome supervision, Eq. of section 4.1.2).
"""

from __future__ import annotations

import time
import zipfile
from pathlib import Path

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from app import store
from app.store.db import session_scope
from grpo_engine.report.metrics import EVAL_METRICS, METRICS
from tests.support.servers import (
    REDIS_URL,
    Process,
    clean_env,
    start_server,
    wait_finished,
)

SPEC = {"name": "e2e", "steps_per_iteration": 4, "batch_size": 2, "group_size": 4, "eval_every": 2}
ADV_EPS = 1e-4  # eps' of the advantage normalisation (docs/algorithm.md, Outcome supervision)


def check_short_run(url: str, logs, spec: dict = SPEC) -> tuple[Client, int]:
    """Launch ``spec`` (SPEC and more keys) through the API, wait for it, and check everything the API
    reports about it; returns the client and the run id."""
    client = Client(url, verbose=False)

    # 1. launch and wait
    launched = client.predict(spec, api_name="/launch_run")
    assert launched["status"] == "queued"
    run_id = launched["run_id"]
    run = wait_finished(client, run_id, logs)
    assert run["status"] == "completed", f"{run['error']}\n{logs()}"
    assert (run["step"], run["total_steps"], run["error"]) == (4, 4, None)
    assert run["config"]["group_size"] == 4 and run["started_at"] and run["finished_at"]
    assert any(r["run_id"] == run_id and r["status"] == "completed" for r in client.predict(api_name="/list_runs"))

    # 2. metrics: step 0 (evaluation before training), then every step with every documented metric
    metrics = client.predict(run_id, api_name="/get_metrics")
    assert [m["step"] for m in metrics] == [0, 1, 2, 3, 4]
    step_keys = set(METRICS) - {*EVAL_METRICS, "time/eval"}
    for m in metrics[1:]:
        assert step_keys <= set(m), sorted(step_keys - set(m))
        assert m["iteration"] == 1
    assert [m["step"] for m in metrics if "eval/accuracy" in m] == [0, 2, 4]
    assert all(set(EVAL_METRICS) <= set(m) for m in metrics if "eval/accuracy" in m)
    assert all(0.0 <= m["eval/accuracy"] <= 1.0 for m in metrics if "eval/accuracy" in m)

    # 3. groups: B groups per step, G samples each, advantages = group-normalised rewards on every token
    groups = client.predict(run_id, 2, api_name="/list_groups")
    assert len(groups) == SPEC["batch_size"] and all(g["step"] == 2 for g in groups)
    assert [g["step"] for g in client.predict(run_id, None, api_name="/list_groups")] == [4, 4]
    for listed in groups:
        group = client.predict(listed["group_id"], api_name="/get_group")
        assert (group["group_id"], group["run_id"], group["step"]) == (listed["group_id"], run_id, 2)
        assert group["prompt"] == listed["prompt"] and group["reference"]
        samples = group["samples"]
        assert len(samples) == SPEC["group_size"]
        rewards = [s["reward"] for s in samples]
        mean = sum(rewards) / len(rewards)
        std = (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5  # population std
        assert listed["reward_mean"] == pytest.approx(mean, abs=1e-6)
        assert listed["reward_std"] == pytest.approx(std, abs=1e-6)
        for sample, r in zip(samples, rewards, strict=True):
            assert len(sample["advantages"]) == len(sample["tokens"]) > 0
            expected = 0.0 if std == 0 else (r - mean) / (std + ADV_EPS)
            assert sample["advantages"] == pytest.approx([expected] * len(sample["tokens"]), abs=1e-3)
            assert sample["step_end_indices"] is None  # outcome supervision
            assert "".join(sample["tokens"]).startswith(sample["completion"])

    # 4. the trained policy: a zip of a Hugging Face model directory that transformers loads
    check_policy_export(client, run_id)
    return client, run_id


def check_policy_export(client: Client, run_id: int) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    download = client.predict(run_id, "model", api_name="/export_run")
    path = download if isinstance(download, str) else download["path"]
    out = Path(path).with_suffix("")
    with zipfile.ZipFile(path) as archive:
        archive.extractall(out)
    model_dir = out / f"run-{run_id}-model-fp32"  # the built-in model is fp32: its source dtype
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in model_dir.iterdir()}
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    ids = AutoTokenizer.from_pretrained(model_dir)("2+3*4=", return_tensors="pt").input_ids
    assert model(ids).logits.shape[:2] == ids.shape
    with pytest.raises(AppError, match="lora_rank 0"):
        client.predict(run_id, "adapter", api_name="/export_run")


@pytest.mark.slow
def test_embedded_server_runs_a_short_run(tmp_path, grpo_cache_dir):
    server, url = start_server(tmp_path / "data", clean_env(grpo_cache_dir))
    worker_log = tmp_path / "data" / "worker.log"
    logs = lambda: f"{server.log()}\n--- worker ---\n{worker_log.read_text(errors='replace')}"  # noqa: E731
    try:
        check_short_run(url, logs)
    finally:
        server.stop()


@pytest.mark.slow
def test_a_cancel_during_the_built_in_models_build_ends_the_run_within_seconds(tmp_path):
    """A fresh model cache: the run's first phase builds the built-in model (minutes here); a cancel sent while
    it builds is honoured within 10 s, and the half-built model is not left behind."""
    cache = tmp_path / "cache"
    server, url = start_server(tmp_path / "data", clean_env(cache))
    worker_log = tmp_path / "data" / "worker.log"
    logs = lambda: f"{server.log()}\n--- worker ---\n{worker_log.read_text(errors='replace')}"  # noqa: E731
    try:
        client = Client(url, verbose=False)
        run_id = client.predict(SPEC, api_name="/launch_run")["run_id"]
        deadline = time.monotonic() + 120
        while not (
            (run := client.predict(run_id, api_name="/get_run"))["phase"] == "building built-in model"
            and (run["phase_done"] or 0) >= 1
        ):
            assert time.monotonic() < deadline and run["status"] in ("queued", "running"), f"{run}\n{logs()}"
            time.sleep(0.2)
        assert client.predict(run_id, api_name="/cancel_run")["status"] == "running"
        cancelled_at = time.monotonic()
        run = wait_finished(client, run_id, logs, timeout=10)
        assert run["status"] == "cancelled" and time.monotonic() - cancelled_at < 10, f"{run}\n{logs()}"
        assert any("cancelled while loading" in line for line in client.predict(run_id, api_name="/get_logs")), logs()
        assert not [p.name for p in cache.iterdir() if p.is_dir()], logs()  # no partial model directory
    finally:
        server.stop()


@pytest.mark.slow
def test_embedded_server_runs_a_two_process_run_like_a_single_process_one(tmp_path, grpo_cache_dir):
    """devices: 2 on this machine's CPU: the worker launches 2 processes through Accelerate (gloo). The run
    passes the same checks as a single-process one, and records the same metrics and group fields."""
    server, url = start_server(tmp_path / "data", clean_env(grpo_cache_dir))
    worker_log = tmp_path / "data" / "worker.log"
    logs = lambda: f"{server.log()}\n--- worker ---\n{worker_log.read_text(errors='replace')}"  # noqa: E731
    try:
        client, single = check_short_run(url, logs, {**SPEC, "seed": 1})
        client, double = check_short_run(url, logs, {**SPEC, "seed": 1, "devices": 2, "device": "cpu"})
        with session_scope(f"sqlite:///{tmp_path / 'data' / 'grpo.sqlite'}") as s:
            assert any("2 data-parallel processes (MULTI_CPU)" in line for line in store.get_logs(s, double, 200))
            # the run's log (the Run tab shows it) starts with the memory estimate
            assert any(
                line.startswith("memory estimate (activations not included): policy ")
                for line in store.get_logs(s, single, 200)
            )
        for a, b in zip(
            client.predict(single, api_name="/get_metrics"),
            client.predict(double, api_name="/get_metrics"),
            strict=True,
        ):
            assert set(a) == set(b) and all(type(a[k]) is type(b[k]) for k in a)
        one, two = (
            client.predict(client.predict(r, 4, api_name="/list_groups")[0]["group_id"], api_name="/get_group")
            for r in (single, double)
        )
        assert set(one) == set(two) and set(one["samples"][0]) == set(two["samples"][0])
    finally:
        server.stop()


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.redis
def test_postgres_redis_server_with_a_separate_worker(tmp_path, grpo_cache_dir, postgres_url, redis_queue):
    env = clean_env(
        grpo_cache_dir,
        GRPO_DATABASE_URL=postgres_url,
        GRPO_BROKER_URL=REDIS_URL,
        GRPO_QUEUE=redis_queue,
        GRPO_EMBEDDED_WORKER="0",
        GRPO_CHECKPOINT_DIR=str(tmp_path / "shared-checkpoints"),
    )  # a mount the worker and dashboard share
    (tmp_path / "worker").mkdir()
    worker = Process(["worker", "--data-dir", str(tmp_path / "worker")], env, tmp_path / "worker.log")
    server = None
    try:
        server, url = start_server(tmp_path / "data", env)
        assert "no embedded worker" in server.log()
        logs = lambda: f"{server.log()}\n--- worker ---\n{worker.log()}"  # noqa: E731
        client, _ = check_short_run(url, logs)
        assert "ready." in worker.log()
        assert f"queues {redis_queue},{redis_queue}.cpu" in worker.log()  # no GPU here: the CPU class

        # device routing: a 'cpu' run is taken by this CPU worker, a 'gpu' run waits for a GPU worker
        gpu = client.predict({**SPEC, "device": "gpu"}, api_name="/launch_run")["run_id"]
        cpu = client.predict({**SPEC, "device": "cpu", "eval_every": 0}, api_name="/launch_run")["run_id"]
        assert wait_finished(client, cpu, logs)["status"] == "completed", logs()
        assert client.predict(gpu, api_name="/get_run")["status"] == "queued"
        assert client.predict(gpu, api_name="/cancel_run")["status"] == "cancelled"
        assert not (tmp_path / "data" / "worker.log").exists()  # the server started no worker of its own
    finally:
        if server is not None:
            server.stop()
        worker.stop()
