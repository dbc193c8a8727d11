"""Learned reward models (reward: model): what the ORM / PRM read, how they are labelled and replayed,
and short real runs with the iterative refresh, on the built-in model.

The runs use fewer RM samples (run-spec key ``rm_samples``) than the default to stay fast.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from grpo_engine.algo.objective import process_advantages
from grpo_engine.data.builtin_task import check_step
from grpo_engine.data.data import format_prompt, load_dataset
from grpo_engine.model.model import load_policy, resolve_model_path
from grpo_engine.report.metrics import EVAL_METRICS, METRICS, RM_METRICS
from grpo_engine.report.recorder import MemoryRecorder
from grpo_engine.rewards.rewards import outcome_reward
from grpo_engine.rm import rm_training
from grpo_engine.rm.reward_model import accuracy, fit, load_reward_model, replay_mix
from grpo_engine.rollout.outputs import RMExample
from grpo_engine.spec.config import SpecError, validate_spec
from grpo_engine.train import trainer

BASE = dict(reward="model", batch_size=2, group_size=4, max_new_tokens=24, eval_every=0, rm_samples=48)


@pytest.fixture(scope="module")
def builtin_path(grpo_cache_dir) -> str:
    return resolve_model_path("builtin-arith", grpo_cache_dir)


def rm_of(path: str, kind: str):
    torch.manual_seed(0)
    return load_reward_model(path, kind, torch.device("cpu"))


def expected_logits(rm, ids: list[int], reads: list[int], starts: list[int]) -> list[float]:
    """head(hidden at each read) + prior_weight * min over the read's span of the frozen LM's token log-probs,
    computed for one unpadded sequence."""
    with torch.no_grad():
        x = torch.tensor([ids])
        hidden = rm.backbone(input_ids=x).last_hidden_state[0]  # (L, H)
        logp = torch.log_softmax(rm.prior(input_ids=x).logits[0].float(), -1)  # (L, V)
        token_logp = [0.0] + [logp[t - 1, ids[t]].item() for t in range(1, len(ids))]
        return [
            rm.head(hidden[r]).item() + rm.prior_weight.item() * min(token_logp[s : r + 1])
            for s, r in zip(starts, reads, strict=True)
        ]


def run(cache_dir, **overrides):
    recorder = MemoryRecorder()
    result = trainer.train(validate_spec({**BASE, **overrides}), recorder, cache_dir, device="cpu")
    return result, recorder


# --- what the heads read -----------------------------------------------------------------------


def test_orm_reads_the_last_real_token_whatever_the_padding(builtin_path):
    rm = rm_of(builtin_path, "orm").eval()
    short = RMExample("2+3*4", ["3*4=12\n2+12=14\n#### 14"], [])
    long = RMExample("6-5*1", ["6-5=1\n1*1=1\n#### 1\n5*1=5\n6-5=1\n#### 1"], [])
    ids, reads, starts = rm.encode(short.question, short.steps)
    prompt = rm.tokenizer.encode("2+3*4\n", add_special_tokens=False)
    assert ids[: len(prompt)] == prompt and starts == [len(prompt)]  # the span: the whole output and EOS
    assert ids[-1] == rm.tokenizer.eos_token_id and reads == [len(ids) - 1]
    with torch.no_grad():
        batched = rm.logits([short, long])  # the short one is right-padded
        assert [x.shape for x in batched] == [torch.Size([1]), torch.Size([1])]
        assert rm.logits([short])[0].item() == pytest.approx(batched[0].item(), abs=1e-4)
    assert batched[0].item() == pytest.approx(expected_logits(rm, ids, reads, starts)[0], abs=1e-4)
    assert rm.prior_weight.item() == 1.0 and not any(p.requires_grad for p in rm.prior.parameters())
    scores = rm.score([short, long])
    assert all(len(s) == 1 and 0.0 < s[0] < 1.0 for s in scores)


def test_prm_reads_at_each_step_end(builtin_path):
    rm = rm_of(builtin_path, "prm").eval()
    steps = ["3*4=12", "2+12=14", "#### 14"]
    ids, reads, starts = rm.encode("2+3*4", steps)
    assert len(reads) == 3 and reads == sorted(reads) and reads[-1] < len(ids) - 1  # EOS is no step
    for j, r in enumerate(reads):  # the text up to each read position ends with that step
        assert rm.tokenizer.decode(ids[: r + 1]).endswith(steps[j])
        assert rm.tokenizer.decode(ids[starts[j] : r + 1]).strip() == steps[j]  # the step's span
        after = ids[r + 1]  # the next token starts the next step's delimiter, or is EOS after the last step
        assert rm.tokenizer.decode([after]) == "\n" if j < len(steps) - 1 else after == rm.tokenizer.eos_token_id
    with torch.no_grad():
        batched = rm.logits(
            [RMExample("2+3*4", steps, []), RMExample("1+1+1", ["1+1=2"], []), RMExample("1+1+1", [], [])]
        )
    assert [x.shape for x in batched] == [torch.Size([3]), torch.Size([1]), torch.Size([0])]
    assert batched[0].tolist() == pytest.approx(expected_logits(rm, ids, reads, starts), abs=1e-4)
    assert all(0.0 < s < 1.0 for s in rm.score([RMExample("2+3*4", steps, [])])[0])


# --- labels without humans, replay, training ----------------------------------------------------


@pytest.mark.parametrize("kind", ["orm", "prm"])
def test_labels_come_from_the_verifier_and_the_step_checker(grpo_cache_dir, kind):
    torch.manual_seed(0)
    policy, tokenizer = load_policy("builtin-arith", grpo_cache_dir, torch.device("cpu"), log=lambda m: None)
    train_set, _ = load_dataset("builtin-arith")
    questions = random.Random(0).choices(train_set, k=20)
    spec = validate_spec({**BASE, "supervision": "outcome" if kind == "orm" else "process"})
    sampler = rm_training.Sampler(policy, tokenizer, format_prompt, "cpu")
    examples = rm_training.sample_labelled(sampler, questions, spec, kind)
    assert len(examples) == len(questions)
    for ex, q in zip(examples, questions, strict=True):
        assert ex.question == q["question"]
        if kind == "orm":
            assert len(ex.steps) == 1 and ex.labels == [outcome_reward(ex.steps[0], q["answer"])[1]["correct"]]
        else:
            assert ex.labels == [float(check_step(s, q["question"], ex.steps[:j])) for j, s in enumerate(ex.steps)]
    labels = [y for ex in examples for y in ex.labels]
    assert set(labels) <= {0.0, 1.0} and labels


def test_replay_mixes_round_ratio_times_fresh_from_history():
    history = [RMExample(f"h{i}", ["x"], [0.0]) for i in range(200)]
    fresh = [RMExample(f"f{i}", ["x"], [1.0]) for i in range(50)]
    for ratio in (0.0, 0.1, 0.25, 1.0):
        mixed, n = replay_mix(fresh, history, ratio, random.Random(0))
        assert n == round(ratio * len(fresh))
        assert mixed[: len(fresh)] == fresh and len(mixed) == len(fresh) + n
        replayed = mixed[len(fresh) :]
        assert all(e in history for e in replayed) and len({e.question for e in replayed}) == n
    assert replay_mix(fresh, history, 0.1, random.Random(3)) == replay_mix(fresh, history, 0.1, random.Random(3))
    assert replay_mix(fresh, history[:2], 0.5, random.Random(0))[1] == 2  # never more than the history holds
    assert replay_mix(fresh, [], 0.1, random.Random(0)) == (fresh, 0)


def test_fit_learns_a_separable_rule_and_accuracy_counts_steps(builtin_path):
    # a PRM told that steps with a "+" are good and steps with a "*" are bad
    rm = rm_of(builtin_path, "prm")
    data = [
        RMExample("2+3*4", ["3*4=12", "2+12=14"], [0.0, 1.0]),
        RMExample("1+2+3", ["1+2=3", "3+3=6"], [1.0, 1.0]),
        RMExample("2*3+1", ["2*3=6", "6+1=7"], [0.0, 1.0]),
        RMExample("5*5-1", ["5*5=25"], [0.0]),
    ] * 8
    loss = fit(rm, data, 1e-3, random.Random(0), epochs=3, batch_size=8)
    assert math.isfinite(loss) and loss < 0.3
    assert not any(p.grad is not None and p.grad.abs().sum() > 0 for p in rm.prior.parameters())  # frozen
    assert accuracy(rm, data) == 1.0
    assert accuracy(rm, [RMExample("2+3*4", ["3*4=12", "2+12=14"], [1.0, 0.0])]) == 0.0  # both steps counted wrong


# --- runs ----------------------------------------------------------------------------------------


def by_step(recorder: MemoryRecorder) -> dict[int, dict]:
    return {m["step"]: m for m in recorder.metrics}


def test_orm_run_trains_then_refreshes_after_each_iteration(grpo_cache_dir):
    result, rec = run(grpo_cache_dir, iterations=2, steps_per_iteration=2, eval_every=2)
    assert result.status == "completed" and result.step == 4
    steps = by_step(rec)
    assert sorted(steps) == [0, 1, 2, 3, 4]
    start = steps[0]  # the initial training on the initial policy's outputs
    assert set(start) == {"step", "iteration", *EVAL_METRICS, "time/eval"} | set(RM_METRICS) - {"rm/accuracy_before"}
    assert start["rm/train_examples"] == BASE["rm_samples"] and start["rm/replayed"] == 0
    replayed = round(0.1 * BASE["rm_samples"])
    # the last step of iteration 1 carries its refresh; after the last iteration nothing would use one
    assert set(RM_METRICS) | set(METRICS) <= set(steps[2])
    assert steps[2]["rm/replayed"] == replayed
    assert steps[2]["rm/train_examples"] == BASE["rm_samples"] + replayed
    assert 0.0 <= steps[2]["rm/accuracy_before"] <= 1.0 and 0.0 <= steps[2]["rm/accuracy_after"] <= 1.0
    assert math.isfinite(steps[2]["rm/loss"]) and steps[2]["rm/loss"] >= 0.0
    for s in (1, 3, 4):
        assert not set(RM_METRICS) & set(steps[s])
    assert set(METRICS) <= set(steps[4])  # eval_every 2: time/eval too
    assert [steps[s]["iteration"] for s in (1, 2, 3, 4)] == [1, 1, 2, 2]
    refreshes = [m for m in rec.messages if "refreshed" in m]
    assert len(refreshes) == 1 and refreshes[0].startswith("iteration 1: ORM") and "->" in refreshes[0]
    assert any("trained on 48 outputs of the initial policy labelled by the verifier" in m for m in rec.messages)

    # r_i is the ORM's score; the verifier's verdict stays in the components and in correct_frac
    for step, groups in rec.group_log.items():
        samples = [s for g in groups for s in g.samples]
        for g in groups:
            for s in g.samples:
                assert 0.0 < s.reward < 1.0 and s.reward_components["rm_score"] == pytest.approx(s.reward)
                assert s.reward_components["correct"] == outcome_reward(s.completion, g.reference)[0]
                assert s.step_rewards is None
        assert steps[step]["correct_frac"] == pytest.approx(
            sum(s.reward_components["correct"] for s in samples) / len(samples)
        )
        assert steps[step]["reward_mean"] == pytest.approx(sum(s.reward for s in samples) / len(samples), abs=1e-5)


def test_prm_run_gives_per_step_scores(grpo_cache_dir):
    result, rec = run(grpo_cache_dir, supervision="process", steps_per_iteration=1, iterations=2)
    assert result.status == "completed"
    steps = by_step(rec)
    assert sorted(steps) == [0, 1, 2] and "rm/accuracy_after" in steps[0] and "rm/accuracy_before" in steps[1]
    assert "rm/loss" not in steps[2]  # no refresh after the last iteration
    assert any(s.step_rewards for groups in rec.group_log.values() for g in groups for s in g.samples)
    for groups in rec.group_log.values():
        for g in groups:
            for s in g.samples:
                assert len(s.step_rewards) == len(s.step_end_indices)
                assert all(0.0 < r < 1.0 for r in s.step_rewards)
                assert all(0 <= e < len(s.tokens) for e in s.step_end_indices)
                mean = sum(s.step_rewards) / len(s.step_rewards) if s.step_rewards else 0.0
                assert s.reward == pytest.approx(mean) and s.reward_components["rm_score"] == pytest.approx(mean)
                assert "correct" in s.reward_components
            width = max(len(s.tokens) for s in g.samples)
            expected = process_advantages(
                [s.step_rewards for s in g.samples], [s.step_end_indices for s in g.samples], width
            )
            for i, s in enumerate(g.samples):
                assert s.advantages == pytest.approx(expected[i, : len(s.tokens)].tolist(), abs=1e-4)


def test_a_missing_reward_model_path_fails_the_run_naming_it(grpo_cache_dir, tmp_path):
    missing = str(tmp_path / "no-such-rm")
    with pytest.raises(FileNotFoundError, match="no-such-rm"):
        run(grpo_cache_dir, reward_model=missing, steps_per_iteration=1)


# --- the run spec ----------------------------------------------------------------------------------


def test_reward_model_keys_validate_naming_the_key():
    spec = validate_spec({"reward": "model"})
    assert spec.reward == "model" and spec.reward_model == ""
    assert validate_spec({"reward": "model", "reward_model": " org/rm-1b "}).reward_model == "org/rm-1b"
    assert validate_spec({"reward": "rule", "reward_model": "  "}).reward_model == ""
    for bad in (
        {"reward_model": "org/rm"},
        {"reward": "model", "reward_model": "my model"},
        {"reward": "model", "reward_model": 3},
    ):
        with pytest.raises(SpecError) as info:
            validate_spec(bad)
        assert info.value.key == "reward_model" and "reward_model" in str(info.value)
    with pytest.raises(SpecError) as info:
        validate_spec({"reward": "learned"})
    assert info.value.key == "reward"
    for key, value in (("rm_replay_ratio", 1.5), ("rm_learning_rate", 0.0)):
        with pytest.raises(SpecError) as info:
            validate_spec({"reward": "model", key: value})
        assert info.value.key == key and key in str(info.value)


def write_math_shepherd(path, n: int = 40):
    """Built-in questions with right and wrong solutions in Math-Shepherd's format: every step ends with
    the tag 'ки'; the label text has '+' (the step checker accepts it) or '-' in its place."""
    import json

    from grpo_engine.data.builtin_task import builtin_examples, solve

    rows = []
    for k, ex in enumerate(builtin_examples()[0][:n]):
        q = ex["question"]
        steps, answer = solve(int(q[0]), q[1], int(q[2]), q[3], int(q[4]), respect_precedence=k % 2 == 0)
        steps = steps + [f"#### {answer}"]
        marks = ["+" if check_step(s, q, steps[:j]) else "-" for j, s in enumerate(steps)]
        body = "".join(f"Step {j + 1}: {s} ки\n" for j, s in enumerate(steps))
        label = "".join(f"Step {j + 1}: {s} {m}\n" for j, (s, m) in enumerate(zip(steps, marks, strict=True)))
        rows.append({"input": f"{q} {body}", "label": f"{q} {label}"})
    rows.append({"input": "a row with no tag", "label": "a row with no tag"})  # skipped, as real slips are
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_prm_trains_on_math_shepherd_data(grpo_cache_dir, tmp_path):
    data = write_math_shepherd(tmp_path / "shepherd.jsonl")
    spec = validate_spec(
        {
            "supervision": "process",
            "reward": "model",
            "rm_data": str(data),
            "rm_samples": 16,
            "iterations": 2,
            "steps_per_iteration": 1,
            "batch_size": 2,
            "group_size": 4,
            "eval_every": 0,
        }
    )
    recorder = MemoryRecorder()
    assert trainer.train(spec, recorder, grpo_cache_dir, device="cpu").status == "completed"
    assert any("40 step-labelled solutions (1 rows skipped), 4 held out" in m for m in recorder.messages)
    first, refresh = recorder.metrics[0], recorder.metrics[1]  # the refresh after iteration 1 (none after the last)
    assert first["step"] == 0 and first["rm/train_examples"] == 16 and 0.0 <= first["rm/accuracy_after"] <= 1.0
    assert refresh["rm/train_examples"] == 16 + round(0.1 * 16) and "rm/accuracy_before" in refresh
    # rm_data is the warm start; the refresh trains on the policy's own samples, as Algorithm 1 says
    assert any(
        "refreshed on 18 examples (the policy's samples labelled by the built-in task's exact step checker, 2 replayed)"
        in m
        for m in recorder.messages
    )
    with pytest.raises(SpecError, match="rm_data: is PRM training data"):
        validate_spec({"rm_data": str(data)})
