"""Cancel and shutdown are heeded inside the reward model's work (sampling, labelling and training, which can
take minutes with a large rm_samples), not only at step boundaries: the engine with a recorder that asks it to
stop, and the worker's runner on a real store, cancelled through the store and paused as SIGTERM does."""

from __future__ import annotations

import threading
import time

import pytest

from app import store
from app.store.db import session_scope, upgrade_database
from grpo_engine.report.recorder import MemoryRecorder
from grpo_engine.spec.config import validate_spec
from grpo_engine.train import checkpoint
from grpo_engine.train.trainer import train

# a reward model whose first training samples 50,000 + 12,500 outputs, 8 at a time: many minutes unless stopped
LONG_RM = {
    "reward": "model",
    "rm_samples": 50_000,
    "batch_size": 2,
    "group_size": 4,
    "max_new_tokens": 16,
    "iterations": 1,
    "steps_per_iteration": 2,
    "eval_every": 0,
}


class StopAfter(MemoryRecorder):
    """Says ``reason`` from its ``calls``-th should_stop in the reward model's work on; counts those calls (the
    checks of loading, before it, go on)."""

    def __init__(self, calls: int, reason: str):
        super().__init__()
        self.calls, self.reason, self.asked, self.current = calls, reason, 0, None

    def phase(self, name, done=None, total=None):
        self.current = name

    def should_stop(self):
        if self.current != "training reward model":
            return False
        self.asked += 1
        return self.reason if self.asked >= self.calls else False


@pytest.mark.parametrize("reason,status", [("cancel", "cancelled"), ("pause", "paused")])
def test_a_stop_inside_the_reward_models_sampling_ends_the_run_at_once(grpo_cache_dir, tmp_path, reason, status):
    recorder = StopAfter(calls=3, reason=reason)
    started = time.monotonic()
    result = train(validate_spec(LONG_RM), recorder, grpo_cache_dir, device="cpu", checkpoint_dir=tmp_path / "ckpt")
    assert time.monotonic() - started < 120
    assert result.status == status and result.step == 0 and recorder.asked == 3
    assert any(f"{status} during the reward model's work at step 0" in m for m in recorder.messages)
    assert recorder.metrics == []  # step 0 was never recorded
    assert checkpoint.step_dirs(tmp_path / "ckpt") == []  # no checkpoint, not even a half-done one
    assert not [p for p in (tmp_path / "ckpt").rglob("*") if p.name.startswith(".tmp-step-")]


def test_a_cancel_in_the_store_stops_a_worker_in_the_reward_models_work(grpo_cache_dir, tmp_path, monkeypatch):
    """The worker's runner on a SQLite store: the run is cancelled through the store (as /cancel_run does) while
    the reward model samples; the run ends cancelled within seconds, then a SIGTERM-style interrupt of a second
    run pauses it and puts it back in the queue."""
    from workers import recorder as worker_recorder
    from workers.runner import execute_run

    monkeypatch.setenv("GRPO_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("GRPO_DATABASE_URL", f"sqlite:///{tmp_path / 'grpo.sqlite'}")
    monkeypatch.setenv("GRPO_BROKER_URL", f"sqla+sqlite:///{tmp_path / 'broker.sqlite'}")
    monkeypatch.setenv("GRPO_CACHE_DIR", str(grpo_cache_dir))
    upgrade_database()

    def start(name: str):
        with session_scope() as s:
            run_id = store.create_run(s, validate_spec({**LONG_RM, "name": name}).to_dict(), name)
        outcome = {}
        thread = threading.Thread(target=lambda: outcome.setdefault("result", execute_run(run_id)))
        thread.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with session_scope() as s:
                if any("loading the reward model" in line for line in store.get_logs(s, run_id)):
                    break
            time.sleep(0.5)
        time.sleep(3)  # well inside the reward model's sampling now
        return run_id, thread, outcome

    run_id, thread, outcome = start("cancelled in RM work")
    with session_scope() as s:
        store.request_cancel(s, run_id)
    asked = time.monotonic()
    thread.join(60)
    assert not thread.is_alive() and outcome["result"] == "cancelled" and time.monotonic() - asked < 30
    with session_scope() as s:
        assert store.get_run(s, run_id)["status"] == "cancelled"
        assert any("cancelled during the reward model's work" in line for line in store.get_logs(s, run_id))

    run_id, thread, outcome = start("paused in RM work")
    worker_recorder.interrupt.set()  # what the worker's SIGTERM handler does
    try:
        thread.join(60)
    finally:
        worker_recorder.interrupt.clear()
    assert not thread.is_alive() and outcome["result"] == "paused"
    with session_scope() as s:
        run = store.get_run(s, run_id)
        assert run["status"] == "queued" and run["error"] is None
        assert any("paused during the reward model's work at step 0" in line for line in store.get_logs(s, run_id))
