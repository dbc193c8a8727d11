"""Step labels by rollouts (grpo_engine.rollout_labels, Math-Shepherd's): the hard and soft estimates on hand-made
continuation verdicts, the labels of the built-in policy's own outputs against the exact step checker, and a
process-supervision run whose rule reward comes from rollouts (step_labels: rollouts) on the built-in task."""
from __future__ import annotations

import sys

import pytest

from grpo_engine.recorder import MemoryRecorder
from grpo_engine.rollout_labels import labels_from_rollouts
from tests.servers import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from rollout_labels import labelled_steps  # noqa: E402 (bench/ holds the measurement this test repeats small)


@pytest.mark.parametrize("estimate, expected", [("hard", [1.0, 0.0, 1.0, 0.0]), ("soft", [0.5, 0.0, 1.0, 0.0])])
def test_hard_and_soft_estimates(estimate, expected):
    right = [[True, False, True, False], [False, False, False, False], [True] * 4, []]
    assert labels_from_rollouts(right, estimate) == expected


def test_rollout_labels_of_the_builtin_policy_agree_with_the_exact_checker(grpo_cache_dir):
    rollouts, exact, _ = labelled_steps(grpo_cache_dir, questions=48, n=4, estimate="hard")
    assert [len(r) for r in rollouts] == [len(e) for e in exact]  # one label per step
    pairs = [(r, e) for rs, es in zip(rollouts, exact) for r, e in zip(rs, es)]
    assert {r for r, _ in pairs} <= {0.0, 1.0}
    assert all(rs[-1] == es[-1] for rs, es in zip(rollouts, exact) if rs)  # the last step: the output's own verdict
    assert sum(r == e for r, e in pairs) / len(pairs) >= 0.85  # bench/rollout_labels.py: 0.957 on 256 outputs
    soft, _, _ = labelled_steps(grpo_cache_dir, questions=16, n=4, estimate="soft")
    assert {r for rs in soft for r in rs} <= {0.0, 0.25, 0.5, 0.75, 1.0}


@pytest.mark.slow
def test_a_process_run_rewarded_by_rollout_labels(grpo_cache_dir):
    from grpo_engine.config import validate_spec
    from grpo_engine.trainer import train

    recorder = MemoryRecorder()
    spec = validate_spec(dict(supervision="process", step_labels="rollouts", label_rollouts=2, steps_per_iteration=2,
                              batch_size=2, group_size=4, eval_every=0, max_new_tokens=24))
    assert train(spec, recorder, grpo_cache_dir, device="cpu")["status"] == "completed"
    steps = {m["step"]: m for m in recorder.metrics}
    assert steps[2]["time/labelling"] > 0
    for groups in recorder.group_log.values():
        for group in groups:
            for sample in group.samples:
                assert len(sample.step_rewards) == len(sample.step_end_indices)
                assert set(sample.step_rewards) <= {0.0, 1.0}
