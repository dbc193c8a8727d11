"""Short engine runs compared step by step: a run straight through against one paused and resumed, and the specs
the worker and CLI tests share."""

from __future__ import annotations

import pytest

from grpo_engine.report.recorder import MemoryRecorder
from grpo_engine.spec.config import validate_spec
from grpo_engine.train import checkpoint
from grpo_engine.train.trainer import train

BASE = dict(steps_per_iteration=6, batch_size=4, group_size=4, eval_every=3, checkpoint_every=2)


COMPARED = ("reward_mean", "loss", "kl", "grad_norm", "eval/accuracy", "rm/accuracy_after")


class PauseAt(MemoryRecorder):
    """Says "pause" at the boundary before step ``at + 1``; records resume() and checkpoint() events."""

    def __init__(self, at: int | None):
        super().__init__()
        self.at, self.resumed, self.checkpoints = at, [], []

    def resume(self, step):
        self.resumed.append(step)

    def checkpoint(self, step, path):
        self.checkpoints.append(step)

    def should_stop(self):
        done = self.metrics[-1]["step"] if self.metrics else 0
        return "pause" if self.at is not None and done == self.at else False


def metrics_by_step(recorder) -> dict[int, dict]:
    return {m["step"]: {k: v for k, v in m.items() if k in COMPARED} for m in recorder.metrics}


def straight_and_resumed(cache_dir, tmp_path, pause_at: int, **overrides):
    """The same spec run once straight through and once paused after ``pause_at`` then resumed."""
    spec = validate_spec({**BASE, **overrides})
    straight = PauseAt(None)
    assert train(spec, straight, cache_dir, device="cpu", checkpoint_dir=tmp_path / "straight").status == "completed"
    first, second = PauseAt(pause_at), PauseAt(None)
    paused = train(spec, first, cache_dir, device="cpu", checkpoint_dir=tmp_path / "resumed")
    assert paused.status == "paused" and paused.step == pause_at
    assert checkpoint.latest(tmp_path / "resumed")[0] == pause_at  # saved on the way out
    resumed = train(spec, second, cache_dir, device="cpu", checkpoint_dir=tmp_path / "resumed")
    assert resumed.status == "completed" and resumed.step == spec.total_steps
    assert first.resumed == [0] and second.resumed == [pause_at]
    assert any(f"resuming from the checkpoint after step {pause_at}" in m for m in second.messages)
    return straight, first, second


def assert_same_metrics(straight, first, second, pause_at):
    expected = metrics_by_step(straight)
    assert any(v.get("grad_norm", 0) > 0 for v in expected.values())  # the policy did move: the test can fail
    got = {**metrics_by_step(first), **metrics_by_step(second)}
    assert sorted(m["step"] for m in second.metrics) == [s for s in sorted(expected) if s > pause_at]
    for step, values in expected.items():
        assert got[step].keys() == values.keys(), step
        for key, value in values.items():
            assert got[step][key] == pytest.approx(value, rel=1e-5, abs=1e-6), (step, key)


TINY_SPEC = {"steps_per_iteration": 2, "batch_size": 2, "group_size": 2, "eval_every": 1, "max_new_tokens": 16}
