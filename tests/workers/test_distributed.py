"""Runs with devices > 1: the worker's side (workers/distributed.py) launching 2 CPU processes through
Accelerate (gloo), driven by ``execute_run`` in this process on a fresh SQLite store.

The end-to-end test through the dashboard is in test_e2e.py; the engine's single-process behaviour is
in test_trainer.py and test_checkpoint.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from app import store
from app.store.db import session_scope
from grpo_engine.spec.config import validate_spec
from tests.support.distributed import create_run, pause_after_step, stored_metrics
from workers.distributed import MainProcessRecorder
from workers.runner import execute_run

SPEC = {
    "steps_per_iteration": 30,
    "batch_size": 4,
    "group_size": 4,
    "max_new_tokens": 32,
    "eval_every": 10,
    "checkpoint_every": 2,
    "devices": 2,
    "device": "cpu",
    "seed": 3,
}


@pytest.mark.slow
def test_two_processes_pause_and_resume_exactly(store_url, tmp_path):
    """A 2-process run stopped by its worker's shutdown pauses with a checkpoint of both processes' random
    states; resumed, it records step for step what an uninterrupted 2-process run records."""
    whole = create_run(store_url, SPEC)
    assert execute_run(whole) == "completed"
    expected = stored_metrics(store_url, whole)
    assert [m["step"] for m in expected] == list(range(31))
    with session_scope(store_url) as s:
        assert len(store.list_groups(s, whole, 30)) == SPEC["batch_size"]  # both processes' groups, gathered

    paused = create_run(store_url, SPEC)
    assert pause_after_step(store_url, paused, 3) == "paused"
    with session_scope(store_url) as s:
        run = store.get_run(s, paused)
        assert run["status"] == "queued" and 3 <= run["checkpoint_step"] < 30
        logs = store.get_logs(s, paused, 200)
    assert any("paused before step" in line for line in logs)
    assert execute_run(paused) == "completed"
    with session_scope(store_url) as s:
        assert any("resuming from the checkpoint" in line for line in store.get_logs(s, paused, 200))
    assert stored_metrics(store_url, paused) == expected
    assert (tmp_path / "checkpoints" / f"run-{paused}" / "final" / "model" / "model.safetensors").exists()


@pytest.mark.slow
def test_a_failing_process_fails_the_run_with_its_error(store_url):
    run_id = create_run(store_url, {**SPEC, "batch_size": 4000})  # more questions than the dataset has
    assert execute_run(run_id) == "failed"
    with session_scope(store_url) as s:
        run = store.get_run(s, run_id)
    assert run["error"].startswith("ValueError: batch_size 4000 is larger than the dataset's")
    assert not [t for t in threading.enumerate() if t.name == "recorder-writer"]  # the worker's writer was closed


def test_the_main_process_stops_when_told_or_when_its_worker_is_gone(store_url, tmp_path):
    run_id = create_run(store_url, SPEC)
    stop_file = tmp_path / "stop"
    live = MainProcessRecorder(run_id, "w", stop_file, parent_pid=os.getpid())
    assert live.should_stop() is False
    stop_file.write_text("pause")
    assert live.should_stop() == "pause"

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    orphan = MainProcessRecorder(run_id, "w", tmp_path / "no-stop-file", parent_pid=gone.pid)
    assert orphan.should_stop() == "lost"


def test_devices_must_divide_the_batch_and_gpus_must_exist():
    with pytest.raises(ValueError, match="devices: batch_size 6 must be a multiple of devices 4"):
        validate_spec({"batch_size": 6, "devices": 4})
    import torch

    from workers.distributed import on_cpu

    if not torch.cuda.is_available():
        assert on_cpu(validate_spec({"devices": 2}))  # auto on a machine without a GPU: CPU processes
        with pytest.raises(ValueError, match="device: the run asks for 'gpu'"):
            on_cpu(validate_spec({"devices": 2, "device": "gpu"}))
    else:
        with pytest.raises(ValueError, match="devices: the run asks for 64 GPUs"):
            on_cpu(validate_spec({"devices": 64, "batch_size": 64, "device": "gpu"}))


@pytest.mark.slow
def test_two_processes_with_lora_a_learned_reward_model_and_two_iterations(store_url, tmp_path):
    """The paths that rebuild or share state across processes: LoRA folded into a new reference and a fresh
    adapter prepared again at iteration 2, and the learned ORM trained on the main process then sent to
    the other (its first training and its refresh)."""
    spec = {
        **SPEC,
        "steps_per_iteration": 3,
        "iterations": 2,
        "lora_rank": 4,
        "reward": "model",
        "rm_samples": 16,
        "eval_every": 0,
        "micro_batch_size": 4,
        "policy_updates_per_batch": 2,
    }
    run_id = create_run(store_url, spec)
    assert execute_run(run_id) == "completed"
    with session_scope(store_url) as s:
        metrics = store.get_metrics(s, run_id)
    assert [m["step"] for m in metrics] == list(range(7))  # step 0: the RM's first training
    assert "rm/accuracy_after" in metrics[0] and "rm/accuracy_before" in metrics[3]  # the refresh after iteration 1
    assert all(m["clip_frac"] >= 0 and m["kl"] >= 0 for m in metrics[1:])
    assert (tmp_path / "checkpoints" / f"run-{run_id}" / "final" / "adapter").is_dir()
