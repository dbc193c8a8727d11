"""Runs of 2 CPU processes (tests/workers/test_distributed.py, test_sharding.py): a worker's store and a run in it, driven here."""

from __future__ import annotations

import threading
import time

from app import store
from app.store.db import session_scope
from grpo_engine.report.metrics import EVAL_METRICS
from grpo_engine.spec.config import validate_spec
from workers.recorder import interrupt
from workers.runner import execute_run

COMPARED = (
    "reward_mean",
    "reward_std",
    "correct_frac",
    "zero_std_frac",
    "loss",
    "kl",
    "clip_frac",
    "entropy",
    "completion_len",
    "truncated_frac",
    "grad_norm",
    *EVAL_METRICS,
)


def create_run(url: str, spec: dict) -> int:
    with session_scope(url) as s:
        return store.create_run(s, validate_spec(spec).to_dict(), "test")


def stored_metrics(url: str, run_id: int) -> list[dict]:
    with session_scope(url) as s:
        return [{k: m[k] for k in ("step", *COMPARED) if k in m} for m in store.get_metrics(s, run_id)]


def pause_after_step(url: str, run_id: int, step: int) -> str:
    """Run ``run_id`` here, shutting its worker down (as SIGTERM would) once it has recorded ``step``; its status."""

    def shut_down():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if any(m["step"] >= step for m in stored_metrics(url, run_id)):
                interrupt.set()
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=shut_down, daemon=True)
    watcher.start()
    try:
        return execute_run(run_id)
    finally:
        interrupt.clear()
        watcher.join()
