"""Short real runs of grpo_engine.train.trainer.train on the built-in model, recorded in memory.

The built-in model is built once per session in the ``grpo_cache_dir`` fixture (tests/conftest.py).
"""

from __future__ import annotations

import math

import pytest
import torch

from grpo_engine.algo.objective import ADV_EPS, process_advantages
from grpo_engine.data.builtin_task import check_step
from grpo_engine.data.data import format_prompt
from grpo_engine.report.metrics import EVAL_METRICS, METRICS
from grpo_engine.report.recorder import MemoryRecorder
from grpo_engine.rewards.rewards import final_answer, outcome_reward
from grpo_engine.rollout.tokenization import step_boundaries
from grpo_engine.spec.config import validate_spec
from grpo_engine.train.evaluation import eval_scores
from grpo_engine.train.placement import cpu_bf16_is_fast
from grpo_engine.train.trainer import train

BASE = dict(steps_per_iteration=3, batch_size=2, group_size=4, eval_every=2, max_new_tokens=24)
# The KL at step 1, where the reference is the policy: 0 in fp32. Where precision 'auto' scores in bf16 (a CPU with
# bf16 instructions) the frozen reference is kept in bf16 while the policy stays fp32 under autocast: a log-ratio of
# bf16's rounding (2^-8) a token gives k3 = r - log r - 1 ~ 2^-17 ~ 8e-6 (1e-5 measured on an AMX CPU).
KL_AT_START = 1e-4 if cpu_bf16_is_fast() else 1e-6


def run(cache_dir, recorder=None, **overrides):
    recorder = recorder or MemoryRecorder()
    result = train(validate_spec({**BASE, **overrides}), recorder, cache_dir, device="cpu")
    return result, recorder


@pytest.fixture(scope="module")
def outcome_run(grpo_cache_dir):
    return run(grpo_cache_dir)


@pytest.fixture(scope="module")
def process_run(grpo_cache_dir):
    return run(grpo_cache_dir, supervision="process", steps_per_iteration=2, batch_size=3, eval_every=0)


def by_step(recorder: MemoryRecorder) -> dict[int, dict]:
    return {m["step"]: m for m in recorder.metrics}


# --- outcome supervision ---------------------------------------------------------------------


def test_outcome_run_completes_and_records_every_metric(outcome_run):
    result, rec = outcome_run
    assert result.status == "completed" and result.step == 3
    assert rec.total_steps == 3
    steps = by_step(rec)
    assert sorted(steps) == [0, 1, 2, 3]
    assert set(steps[0]) == {"step", "iteration", *EVAL_METRICS, "time/eval"}  # before training
    assert 0.0 <= steps[0]["eval/accuracy"] <= 1.0
    for s in (2, 3):  # eval_every=2, and the last step
        assert set(METRICS) <= set(steps[s]), set(METRICS) - set(steps[s])
    assert set(METRICS) - {*EVAL_METRICS, "time/eval"} <= set(steps[1])
    assert not set(EVAL_METRICS) & set(steps[1])
    assert "time/eval" not in steps[1] and steps[2]["time/eval"] > 0
    for s in (1, 2, 3):
        assert steps[s]["iteration"] == 1
        assert all(math.isfinite(v) for v in steps[s].values())
        assert steps[s]["clip_frac"] == 0.0  # mu = 1: the ratio is exactly 1
    # a step whose every group has zero spread (every advantage 0) is measured, not stepped; any other is stepped
    for s in (1, 2, 3):
        no_signal = steps[s]["groups/zero_spread"] == BASE["batch_size"]
        assert steps[s]["update/skipped"] == float(no_signal), s
    assert 0.0 <= steps[1]["kl"] < KL_AT_START  # reference == policy at step 1


def test_outcome_groups_carry_group_normalised_advantages(outcome_run):
    _, rec = outcome_run
    assert sorted(rec.group_log) == [1, 2, 3]
    for groups in rec.group_log.values():
        assert len(groups) == 2
        for group in groups:
            assert len(group.samples) == 4
            assert group.reference == str(eval(group.prompt))
            assert group.model_prompt.endswith(format_prompt(group.prompt))  # the plain template (after any BOS)
            rewards = torch.tensor([s.reward for s in group.samples])
            std = rewards.std(unbiased=False).item()
            mean = rewards.mean().item()
            for s in group.samples:
                assert s.reward == outcome_reward(s.completion, group.reference)[0]
                assert s.reward_components["correct"] == s.reward
                assert s.step_rewards is None and s.step_end_indices is None
                assert len(s.advantages) == len(s.tokens) > 0
                assert all(isinstance(a, float) for a in s.advantages)
                expected = (s.reward - mean) / (std + ADV_EPS) if std > 0 else 0.0
                assert s.advantages == pytest.approx([expected] * len(s.tokens), abs=1e-5)


# --- answer_match: the reward's rule, and evaluation under both -----------------------------


def check_evaluations(rec: MemoryRecorder, match: str) -> None:
    """Step 0 and every evaluation step hold the four evaluation metrics, each a share, consistent with the rules:
    strict <= flexible, the two differ only on outputs without a strict answer (flexible - strict <= 1 - format),
    eval/accuracy is the run's rule's; the log line gives them all."""
    evaluated = [m for m in rec.metrics if "eval/accuracy" in m]
    assert [m["step"] for m in evaluated] == [0, 2, 3]
    for m in evaluated:
        assert set(EVAL_METRICS) <= set(m) and all(0.0 <= m[k] <= 1.0 for k in EVAL_METRICS)
        strict, flexible, formatted = m["eval/accuracy_strict"], m["eval/accuracy_flexible"], m["eval/format"]
        assert strict <= flexible <= strict + (1.0 - formatted) + 1e-9
        assert m["eval/accuracy"] == m[f"eval/accuracy_{match}"]
    logged = [line for line in rec.messages if "eval/accuracy" in line]
    assert len(logged) == 3 and all("strict" in line and "flexible" in line and "format" in line for line in logged)


def test_a_strict_run_records_both_rules_accuracies_and_the_format(outcome_run):
    check_evaluations(outcome_run[1], "strict")


def test_a_flexible_run_rewards_and_evaluates_by_the_last_number(grpo_cache_dir):
    result, rec = run(grpo_cache_dir, answer_match="flexible", format_reward=0.5)
    assert result.status == "completed"
    check_evaluations(rec, "flexible")
    samples = [(s, g.reference) for groups in rec.group_log.values() for g in groups for s in g.samples]
    for s, reference in samples:  # the reward: the verifier under 'flexible', its format part the strict form's
        assert (s.reward, s.reward_components) == outcome_reward(s.completion, reference, 0.5, "flexible")
        assert (s.answer, s.answer_rule) == final_answer(s.completion, "flexible")  # the reading it was paid for
        assert s.reward_components["correct"] >= outcome_reward(s.completion, reference)[1]["correct"]
    for step, groups in rec.group_log.items():  # correct_frac: the share of outputs the flexible verifier accepts
        correct = [s.reward_components["correct"] for g in groups for s in g.samples]
        assert by_step(rec)[step]["correct_frac"] == pytest.approx(sum(correct) / len(correct))


def test_eval_scores_on_hand_outputs():
    texts = ["Tom has 3 + 5 = 8 apples.", "#### 14", "#### 9", "so \\boxed{6}", "It is 1,000.", "no idea"]
    answers = ["8", "14", "7", "6", "1000", "3"]
    strict = eval_scores(texts, answers)
    assert strict == {
        "eval/accuracy": 2 / 6,
        "eval/accuracy_strict": 2 / 6,
        "eval/accuracy_flexible": 4 / 6,
        "eval/format": 3 / 6,
    }
    assert eval_scores(texts, answers, "flexible") == {**strict, "eval/accuracy": 4 / 6}
    assert eval_scores([], []) == dict.fromkeys(EVAL_METRICS, 0.0)


def test_evaluation_reads_answers_as_the_reward_does():
    """The issue's outputs: a line of hashes, and prose after them, state no answer (no format, right only under
    'flexible', by the last number, as the reward and the groups' recorded reading have it); extra hashes before a
    number state it."""
    eva = "8 - 5 = 3 stickers left."
    texts = [
        f"{eva}\n######## Eva ended up with 3 stickers!\n########",
        f"{eva}\n######## Eva has 3 left",
        "######## 3",
    ]
    assert eval_scores(texts, ["3"] * 3, "flexible") == {
        "eval/accuracy": 1.0,
        "eval/accuracy_strict": 1 / 3,
        "eval/accuracy_flexible": 1.0,
        "eval/format": 1 / 3,
    }


# --- process supervision ---------------------------------------------------------------------


def test_process_run_records_steps_and_their_advantages(process_run):
    result, rec = process_run
    assert result.status == "completed"
    assert 0.0 <= by_step(rec)[1]["kl"] < KL_AT_START
    for groups in rec.group_log.values():
        for group in groups:
            samples = group.samples
            for s in samples:
                assert len(s.advantages) == len(s.tokens)
                assert len(s.step_rewards) == len(s.step_end_indices)
                ends = s.step_end_indices
                assert ends == sorted(set(ends)), ends  # ascending
                assert all(0 <= e < len(s.tokens) for e in ends)
                assert set(s.step_rewards) <= {0.0, 1.0}
            width = max(len(s.tokens) for s in samples)
            expected = process_advantages(
                [s.step_rewards for s in samples], [s.step_end_indices for s in samples], width
            )
            for i, s in enumerate(samples):
                assert s.advantages == pytest.approx(expected[i, : len(s.tokens)].tolist(), abs=1e-5)


def test_process_step_rewards_judge_the_completion_steps(process_run):
    # each recorded step reward is the step checker's verdict on that step of the decoded completion
    # (the final "#### N" line of a right solution is a right step)
    _, rec = process_run
    for groups in rec.group_log.values():
        for group in groups:
            for s in group.samples:
                steps = step_boundaries([s.completion])[0]
                verdicts = [float(check_step(x, group.prompt, steps[:j])) for j, x in enumerate(steps)]
                assert s.step_rewards == verdicts, (s.completion, s.tokens[-3:])


# --- cancellation and mu > 1 -----------------------------------------------------------------


class StopAfter(MemoryRecorder):
    """Asks to stop once ``n`` training steps have been recorded."""

    def __init__(self, n: int):
        super().__init__()
        self.n = n

    def should_stop(self) -> bool:
        return sum(m["step"] > 0 for m in self.metrics) >= self.n


def test_should_stop_cancels_at_a_step_boundary(grpo_cache_dir):
    result, rec = run(grpo_cache_dir, StopAfter(1), eval_every=0)
    assert result.status == "cancelled" and result.step == 1
    assert [m["step"] for m in rec.metrics] == [1]
    assert sorted(rec.group_log) == [1]


def test_should_stop_before_the_first_step(grpo_cache_dir):
    """A stop asked from the start is heard while the run loads (loading.loading_check): it ends there."""
    result, rec = run(grpo_cache_dir, StopAfter(0), eval_every=0)
    assert result.status == "cancelled" and result.step == 0
    assert rec.total_steps == 0 and rec.metrics == [] and rec.group_log == {}
    assert "cancelled while loading" in rec.messages


def test_several_policy_updates_per_batch_report_clipping(grpo_cache_dir):
    result, rec = run(grpo_cache_dir, policy_updates_per_batch=2, steps_per_iteration=1, eval_every=0)
    assert result.status == "completed"
    metrics = by_step(rec)[1]
    assert 0.0 <= metrics["clip_frac"] <= 1.0
    if any(a != 0 for g in rec.group_log[1] for s in g.samples for a in s.advantages):
        assert metrics["clip_frac"] > 0.0  # the second update sees ratios away from 1


@pytest.mark.parametrize("record_every,expected", [(2, [2, 3]), (0, []), (1, [1, 2, 3])])
def test_record_every_keeps_groups_of_every_kth_step_and_the_last(grpo_cache_dir, record_every, expected):
    result, rec = run(grpo_cache_dir, record_every=record_every, eval_every=0)
    assert result.status == "completed"
    assert sorted(rec.group_log) == expected
    assert [m["step"] for m in rec.metrics] == [1, 2, 3]  # metrics every step whatever record_every says


def test_a_tokenizer_without_a_pad_token_pads_with_eos(grpo_cache_dir, tmp_path):
    import json
    import shutil

    from grpo_engine.model.model import builtin_model_dir

    model_dir = tmp_path / "no-pad"
    shutil.copytree(builtin_model_dir(grpo_cache_dir), model_dir)
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    del config["pad_token"]
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    result, rec = run(grpo_cache_dir, model=str(model_dir), steps_per_iteration=1, eval_every=0)
    assert result.status == "completed" and len(rec.metrics) == 1


def test_process_supervision_splits_steps_at_the_configured_delimiter(grpo_cache_dir):
    _, newline = run(grpo_cache_dir, supervision="process", steps_per_iteration=1, eval_every=0)
    _, semicolon = run(grpo_cache_dir, supervision="process", steps_per_iteration=1, eval_every=0, step_delimiter=";")
    lines = [s for g in newline.group_log[1] for s in g.samples]
    whole = [s for g in semicolon.group_log[1] for s in g.samples]
    assert max(len(s.step_end_indices) for s in lines) > 1  # the built-in model writes one step per line
    assert all(len(s.step_end_indices) <= 1 for s in whole)  # and never a ';': each output is one step
    for s in whole:
        if s.step_end_indices:
            assert "".join(s.tokens[: s.step_end_indices[0] + 1]).strip() == s.completion.strip()


def test_micro_batches_accumulate_the_same_update(grpo_cache_dir):
    """B x G = 8 outputs in micro-batches of 3, 3 and 2: step 1 (the same samples) gives the same loss, KL,
    clip share, entropy and gradient norm as one batch of 8, with mu = 2 so the clip and old log-probs count."""
    common = dict(
        steps_per_iteration=1,
        batch_size=2,
        group_size=4,
        eval_every=0,
        policy_updates_per_batch=2,
        max_new_tokens=32,
        precision="fp32",
    )  # bf16 scoring rounds each micro-batch's sums its own way
    _, whole = run(grpo_cache_dir, **common)
    _, micro = run(grpo_cache_dir, micro_batch_size=3, **common)
    a, b = whole.metrics[0], micro.metrics[0]
    assert a["grad_norm"] > 0
    for key in ("reward_mean", "loss", "kl", "clip_frac", "entropy", "grad_norm"):
        assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key


def test_what_was_loaded_is_frozen_for_the_garbage_collector_during_the_run_only(grpo_cache_dir):
    """train gc.freeze()s what it loaded (full collections then skip the model and libraries), unfreezes it across
    the reference reset of a new iteration and at the end, however the run ends."""
    import gc

    class Frozen(MemoryRecorder):
        def __init__(self):
            super().__init__()
            self.counts = []

        def step(self, step, iteration, metrics):
            self.counts.append(gc.get_freeze_count())
            super().step(step, iteration, metrics)

        def should_stop(self):
            return "cancel" if len(self.counts) == 3 else False

    recorder = Frozen()
    result, _ = run(grpo_cache_dir, recorder, iterations=2, steps_per_iteration=2, eval_every=0)
    assert result.status == "cancelled" and result.step == 3
    assert len(recorder.counts) == 3 and min(recorder.counts) > 10_000  # steps 1, 2 and 3 (after the reset)
    assert gc.get_freeze_count() == 0
