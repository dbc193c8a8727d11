"""The worker side: DBRecorder and execute_run against a real store, and real worker processes.

Fast tests drive ``DBRecorder`` / ``execute_run`` in this process on a fresh SQLite store.
Slow tests start ``python -m grpo_dashboard.cli worker`` on a real broker (the embedded SQLite broker, and
Redis at GRPO_TEST_REDIS_URL, default redis://127.0.0.1:6379/5, each test on its own queue), create
a run with app.store, send the task by name as the dashboard does, and poll the store.
A Redis server that does not answer fails the Redis tests; they are never skipped.

The built-in model is built once per test session in one cache directory (the ``grpo_cache_dir``
fixture of conftest.py).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import redis
from celery import Celery

from app import store
from app.core.broker import RUN_TASK
from app.store.db import session_scope
from grpo_engine.report.recorder import GroupRecord, SampleRecord
from grpo_engine.spec.config import validate_spec
from tests.support.runs import TINY_SPEC
from tests.support.servers import ROOT, stop_process
from workers.recorder import DBRecorder
from workers.runner import execute_run

REDIS_URL = os.environ.get("GRPO_TEST_REDIS_URL", "redis://127.0.0.1:6379/5")
RUN_TIMEOUT = 180  # seconds for a short run, from sending the task to a finished status


def _create_run(url: str, spec: dict) -> int:
    with session_scope(url) as s:
        return store.create_run(s, validate_spec(spec).to_dict(), "test")


def _get_run(url: str, run_id: int) -> dict:
    with session_scope(url) as s:
        return store.get_run(s, run_id)


# ---- in this process -------------------------------------------------------------------------


def test_db_recorder_writes_every_event(sqlite_url):
    run_id = _create_run(sqlite_url, TINY_SPEC)
    recorder = DBRecorder(run_id, sqlite_url)
    recorder.start(2)
    recorder.log("hello")
    sample = SampleRecord(completion="4", tokens=["4"], reward=1.0, advantages=[0.7])
    recorder.groups(1, [GroupRecord(prompt="2+2=", reference="4", samples=[sample, sample])])
    with session_scope(sqlite_url) as s:  # the engine reports a step's groups first: held until its metrics
        assert store.list_groups(s, run_id, 1) == []
    recorder.step(1, 1, {"reward_mean": 0.5, "kl": 0.01})  # ... then both are written in one transaction
    assert recorder.should_stop() is False

    with session_scope(sqlite_url) as s:
        run = store.get_run(s, run_id)
        assert (run["status"], run["total_steps"], run["step"]) == ("running", 2, 1)
        assert store.get_logs(s, run_id) == ["hello"]
        assert store.get_metrics(s, run_id) == [{"step": 1, "iteration": 1, "reward_mean": 0.5, "kl": 0.01}]
        (group,) = store.list_groups(s, run_id, 1)
        assert store.get_group(s, group["group_id"])["samples"][0]["advantages"] == [0.7]
        store.request_cancel(s, run_id)

    assert recorder.should_stop() is False  # asked the store less than a second ago
    time.sleep(1.1)
    assert recorder.should_stop() == "cancel"
    assert recorder.stop_reason == "cancel"


def test_background_recorder_writes_in_order_and_surfaces_a_lost_lease(sqlite_url):
    """The worker's recorder writes on a thread of its own: close() waits for every event; a write refused
    because another worker took the lease is raised in the training loop at its next event."""
    run_id = _create_run(sqlite_url, TINY_SPEC)
    with session_scope(sqlite_url) as s:
        assert store.claim_run(s, run_id, "w1", 60)
    recorder = DBRecorder(run_id, sqlite_url, worker="w1", background=True)
    recorder.start(40)
    sample = SampleRecord(completion="4", tokens=["4"], reward=1.0, advantages=[0.7])
    for step in range(1, 31):
        recorder.groups(step, [GroupRecord(prompt="2+2=", reference="4", samples=[sample] * 4)])
        recorder.step(step, 1, {"reward_mean": step / 100})
        recorder.log(f"line {step}")
        if step == 10:
            recorder.flush()  # the engine does this before a checkpoint: all ten steps are in the store now
            with session_scope(sqlite_url) as s:
                assert [m["step"] for m in store.get_metrics(s, run_id)] == list(range(1, 11))
    recorder.close()
    with session_scope(sqlite_url) as s:
        assert [m["step"] for m in store.get_metrics(s, run_id)] == list(range(1, 31))
        assert store.get_logs(s, run_id, 100) == [f"line {k}" for k in range(1, 31)]
        assert len(store.list_groups(s, run_id, 30)) == 1
        assert store.get_run(s, run_id)["step"] == 30

    lost = DBRecorder(run_id, sqlite_url, worker="w1", background=True)
    with session_scope(sqlite_url) as s:  # another worker takes the run over
        store.requeue_run(s, run_id, "w1")
        assert store.claim_run(s, run_id, "w2", 60)
    lost.step(31, 1, {"reward_mean": 1.0})
    deadline = time.monotonic() + 10
    with pytest.raises(store.LeaseLost):
        while time.monotonic() < deadline:
            lost.should_stop()
            time.sleep(0.05)
    with pytest.raises(store.LeaseLost):
        lost.close()
    with session_scope(sqlite_url) as s:
        assert [m["step"] for m in store.get_metrics(s, run_id)][-1] == 30  # the refused step left nothing


def test_execute_run_without_work(sqlite_url, monkeypatch):
    """Missing, finished and cancelled-while-queued runs end at once, without the engine."""
    monkeypatch.setenv("GRPO_DATABASE_URL", sqlite_url)
    monkeypatch.delitem(sys.modules, "grpo_engine.train.trainer", raising=False)  # other tests may have imported it
    assert execute_run(12345) == "missing"

    done = _create_run(sqlite_url, TINY_SPEC)
    queued_then_cancelled = _create_run(sqlite_url, TINY_SPEC)
    with session_scope(sqlite_url) as s:
        store.finish_run(s, done, "completed")
        store.request_cancel(s, queued_then_cancelled)
    assert execute_run(done) == "completed"
    assert execute_run(queued_then_cancelled) == "cancelled"
    assert _get_run(sqlite_url, queued_then_cancelled)["started_at"] is None
    assert "grpo_engine.train.trainer" not in sys.modules


# ---- real worker processes ---------------------------------------------------------------------


def _redis_broker() -> str:
    redis.Redis.from_url(REDIS_URL, socket_connect_timeout=5).ping()  # down -> the test fails
    return REDIS_URL


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def broker_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqla+sqlite:///{tmp_path / 'broker.sqlite'}"
    return _redis_broker()


class Worker:
    """A running worker process: ``send(run_id)`` enqueues a run for it, ``log()`` is its output so far."""

    def __init__(self, broker_url: str, queue: str, log_path: Path):
        self.sender = Celery("grpo-test", broker=broker_url)
        self.queue = queue
        self.log_path = log_path

    def send(self, run_id: int) -> None:
        self.sender.send_task(RUN_TASK, args=[run_id], queue=self.queue)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextlib.contextmanager
def running_worker(sqlite_url: str, broker_url: str, cache_dir: Path, tmp_path: Path, **settings: str):
    """A real `grpo-dashboard worker` process consuming its own queue, with extra GRPO_* ``settings``."""
    queue = f"grpo-test-{uuid.uuid4().hex[:12]}"
    env = {
        **os.environ,
        "GRPO_DATA_DIR": str(tmp_path),
        "GRPO_DATABASE_URL": sqlite_url,
        "GRPO_BROKER_URL": broker_url,
        "GRPO_QUEUE": queue,
        "GRPO_CACHE_DIR": str(cache_dir),
        **settings,
    }
    handle = Worker(broker_url, queue, tmp_path / "worker.log")
    with open(handle.log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "grpo_dashboard.cli", "worker"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while "ready." not in handle.log():
            assert proc.poll() is None, f"worker exited:\n{handle.log()}"
            assert time.monotonic() < deadline, f"worker not ready:\n{handle.log()}"
            time.sleep(0.2)
        yield handle
    finally:
        handle.sender.close()
        stop_process(proc)
        if broker_url.startswith("redis"):
            client = redis.Redis.from_url(broker_url)
            for key in client.scan_iter(f"*{queue}*"):
                client.delete(key)


@pytest.fixture
def worker(sqlite_url, broker_url, grpo_cache_dir, tmp_path):
    with running_worker(sqlite_url, broker_url, grpo_cache_dir, tmp_path) as handle:
        yield handle


def _wait_finished(url: str, run_id: int, worker: Worker, timeout: float = RUN_TIMEOUT) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        run = _get_run(url, run_id)
        if run["status"] in ("completed", "failed", "cancelled"):
            return run
        assert time.monotonic() < deadline, f"run {run_id} still {run['status']} after {timeout}s:\n{worker.log()}"
        time.sleep(0.5)


@pytest.mark.slow
def test_worker_runs_a_run(worker, sqlite_url):
    run_id = _create_run(sqlite_url, TINY_SPEC)
    worker.send(run_id)
    run = _wait_finished(sqlite_url, run_id, worker)
    assert run["status"] == "completed", f"{run['error']}\n{worker.log()}"
    assert (run["step"], run["total_steps"], run["error"]) == (2, 2, None)
    assert run["started_at"] and run["finished_at"]
    assert (run["phase"], run["phase_done"], run["phase_total"]) == (None, None, None)  # ended: no phase

    with session_scope(sqlite_url) as s:
        metrics = store.get_metrics(s, run_id)
        assert [m["step"] for m in metrics if m["step"] > 0] == [1, 2]
        assert {"reward_mean", "reward_std", "kl", "loss", "eval/accuracy"} <= set(metrics[-1])
        assert store.group_steps(s, run_id) == [1, 2]
        groups = store.list_groups(s, run_id, 2)
        assert len(groups) == 2  # batch_size questions
        group = store.get_group(s, groups[0]["group_id"])
        assert len(group["samples"]) == 2  # group_size outputs
        for sample in group["samples"]:
            assert len(sample["advantages"]) == len(sample["tokens"]) > 0
        assert store.get_logs(s, run_id)


@pytest.mark.slow
@pytest.mark.parametrize("broker_url", ["sqlite"], indirect=True)
def test_worker_records_a_failed_run(worker, sqlite_url, tmp_path):
    missing = tmp_path / "no-such-model"
    run_id = _create_run(sqlite_url, {**TINY_SPEC, "model": str(missing)})
    worker.send(run_id)
    run = _wait_finished(sqlite_url, run_id, worker)
    assert run["status"] == "failed"
    assert str(missing) in run["error"] and "\n" not in run["error"]
    with session_scope(sqlite_url) as s:  # the traceback, with this machine's paths, only in the worker's own log
        logs = store.get_logs(s, run_id)
        assert not any("Traceback" in line or "site-packages" in line for line in logs), logs
        assert any("(the traceback is in that worker's log)" in line for line in logs), logs
    assert "Traceback" in worker.log()


@pytest.mark.slow
@pytest.mark.parametrize("broker_url", ["sqlite"], indirect=True)
def test_worker_cancels_a_running_run(worker, sqlite_url):
    run_id = _create_run(sqlite_url, {**TINY_SPEC, "steps_per_iteration": 500, "eval_every": 0})
    worker.send(run_id)
    deadline = time.monotonic() + RUN_TIMEOUT
    while (run := _get_run(sqlite_url, run_id))["step"] < 1:
        assert run["status"] in ("queued", "running"), run
        assert time.monotonic() < deadline, f"the run made no step:\n{worker.log()}"
        time.sleep(0.3)
    # written before step 1's metrics, by the same ordered writer
    assert (run["phase"], run["phase_total"]) == ("training", 500), run
    with session_scope(sqlite_url) as s:
        assert store.request_cancel(s, run_id) == {"run_id": run_id, "status": "running"}
    run = _wait_finished(sqlite_url, run_id, worker, timeout=60)
    assert run["status"] == "cancelled"
    assert run["step"] < 500
    assert run["phase"] is None


@pytest.mark.slow
@pytest.mark.parametrize("broker_url", ["sqlite"], indirect=True)
def test_a_worker_memory_cap_fails_a_run_cleanly(sqlite_url, broker_url, grpo_cache_dir, tmp_path):
    """GRPO_WORKER_MEMORY_GB: a run that needs more (2,048 outputs a step need ~2.5 GB) fails with the out-of-memory
    message naming the cap, and the same worker then runs a small run (~0.5 GB)."""
    with running_worker(sqlite_url, broker_url, grpo_cache_dir, tmp_path, GRPO_WORKER_MEMORY_GB="1.2") as worker:
        assert "memory capped at 1.2 GB" in worker.log()
        big = _create_run(
            sqlite_url,
            {
                **TINY_SPEC,
                "batch_size": 32,
                "group_size": 64,
                "max_new_tokens": 32,
                "steps_per_iteration": 1,
                "eval_every": 0,
            },
        )
        worker.send(big)
        run = _wait_finished(sqlite_url, big, worker)
        assert run["status"] == "failed", f"{run}\n{worker.log()}"
        assert run["error"].startswith("Out of memory") and "caps its memory at 1.2 GB" in run["error"], run["error"]
        small = _create_run(sqlite_url, TINY_SPEC)
        worker.send(small)
        run = _wait_finished(sqlite_url, small, worker)
        assert run["status"] == "completed", f"{run}\n{worker.log()}"


def test_out_of_memory_errors_say_what_to_lower():
    import torch

    from workers.errors import one_line

    for exc in (
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"),
        RuntimeError(
            "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: "
            "you tried to allocate 1099511627776 bytes"
        ),
        MemoryError(),
    ):
        message = one_line(exc)
        assert message.startswith("Out of memory") and "batch_size" in message and "lora_rank" in message, message
        assert "micro_batch_size" in message and "gradient_checkpointing" in message
    assert one_line(ValueError("dataset 'x' not found\nmore")) == "ValueError: dataset 'x' not found"
