"""The knobs GRPO practitioners expect, each off by default: dynamic sampling (skip_zero_spread, max_resample), over-long
outputs (mask_truncated, overlong_penalty, overlong_buffer), no reference with kl_coef 0, and the learning-rate
schedule (lr_warmup_steps, lr_schedule). Hand-computed numbers for each function, the refusals, and short real runs
of the built-in model (``grpo_cache_dir`` fixture)."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import pytest
import torch

from grpo_engine.algo.dynamic_sampling import fill_informative, join, take
from grpo_engine.algo.overlong import add_overlong_penalty, loss_mask, overlong_penalty
from grpo_engine.report.recorder import MemoryRecorder
from grpo_engine.rollout.forwards import plan_micro_batches
from grpo_engine.rollout.outputs import encode_prompts
from grpo_engine.rollout.tokenization import completion_mask
from grpo_engine.spec.config import SpecError, validate_spec
from grpo_engine.spec.memory import estimate_memory
from grpo_engine.train import loading, trainer
from grpo_engine.train.learner import Sampled
from grpo_engine.train.schedule import learning_rate_at
from grpo_engine.train.step import grpo_step, update
from tests.support.runs import assert_same_metrics, straight_and_resumed

RUN = dict(batch_size=2, group_size=4, steps_per_iteration=3, max_new_tokens=16, eval_every=0)


def run(cache_dir, **overrides):
    """A short run; returns (result, recorder, the learner it trained)."""
    learners, real = [], trainer.load_learner

    def catch(*args, **kwargs):
        loaded = real(*args, **kwargs)
        learners.append(loaded[0])
        return loaded

    recorder = MemoryRecorder()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trainer, "load_learner", catch)
        result = trainer.train(validate_spec({**RUN, **overrides}), recorder, cache_dir, device="cpu")
    return result, recorder, learners[0]


# --- dynamic sampling: fill_informative on a stream of known spreads -----------------------------


def stream(*draws):
    """draw(m) for fill_informative: the next of ``draws`` (each a list of reward spreads), checking it is asked for
    as many groups as it holds."""
    pending, asked = list(draws), []

    def draw(m):
        asked.append(m)
        groups = pending.pop(0)
        assert len(groups) == m
        return groups

    return draw, asked


def informative(spread):
    return spread > 0


def test_fill_informative_draws_as_many_groups_as_are_missing():
    draw, asked = stream([1, 0, 0, 1], [0, 1], [1])
    kept, drawn, dropped = fill_informative(draw, 4, 4, informative)
    assert (len(kept), drawn, dropped, asked) == (4, 7, 3, [4, 2, 1])


def test_fill_informative_stops_after_max_resample_extra_draws():
    draw, asked = stream([1, 0, 0, 1], [0, 1], [1])
    assert fill_informative(draw, 4, 1, informative) == ([1, 1, 1], 6, 3) and asked == [4, 2]
    draw, asked = stream([0, 0, 0, 0])
    assert fill_informative(draw, 4, 0, informative) == ([], 4, 4) and asked == [4]


def test_fill_informative_stops_at_once_when_every_group_differs():
    draw, asked = stream([2, 1, 3])
    assert fill_informative(draw, 3, 4, informative) == ([2, 1, 3], 3, 0) and asked == [3]


def test_fill_informative_draws_what_the_neediest_process_misses():
    # this process is full after draw 0, another misses 2: both draw 2 more, this one's surplus is left unused
    missing = iter([2, 0])
    draw, asked = stream([1, 1], [1, 0])
    kept, drawn, dropped = fill_informative(draw, 2, 4, informative, agree=lambda mine: max(mine, next(missing)))
    assert (kept, drawn, dropped, asked) == ([1, 1], 4, 1, [2, 2])


@dataclass
class Rows:
    batch: list  # per question
    ids: torch.Tensor  # (N, T), right-padded
    prompt_ids: torch.Tensor  # (N, P), left-padded
    texts: list  # per output
    seconds: float


def test_take_and_join_keep_whole_groups_and_pad_each_side():
    a = Rows(
        ["q0", "q1"],
        torch.tensor([[1, 2], [3, 4], [5, 6], [7, 8]]),
        torch.tensor([[9], [9], [8], [8]]),
        ["a", "b", "c", "d"],
        1.5,
    )
    b = Rows(["q2"], torch.tensor([[1, 2, 3], [4, 5, 6]]), torch.tensor([[0, 7], [0, 7]]), ["e", "f"], 0.5)
    joined = join([take(a, [1], 2, 2), take(b, [0], 1, 2)], pad_id=0)
    assert joined.batch == ["q1", "q2"] and joined.texts == ["c", "d", "e", "f"] and joined.seconds == 2.0
    assert joined.ids.tolist() == [[5, 6, 0], [7, 8, 0], [1, 2, 3], [4, 5, 6]]
    assert joined.prompt_ids.tolist() == [[0, 8], [0, 8], [0, 7], [0, 7]]


# --- over-long outputs -------------------------------------------------------------------------


def test_loss_mask_leaves_truncated_outputs_out_only_when_asked():
    mask, ended = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]), torch.tensor([True, False])
    assert loss_mask(mask, ended, True).tolist() == [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
    assert loss_mask(mask, ended, False) is mask


def test_overlong_penalty_ramps_down_over_the_buffer():
    # Lmax 32, Lc 8: 0 up to 24 tokens, then -penalty x (L - 24) / 8
    assert [overlong_penalty(n, 32, 8, 1.0) for n in (1, 24, 25, 28, 32)] == [0.0, 0.0, -0.125, -0.5, -1.0]
    assert overlong_penalty(30, 32, 8, 2.0) == pytest.approx(-1.5)


def test_add_overlong_penalty_outcome_and_process():
    comps = [{}, {}, {}]
    got = add_overlong_penalty([1.0, [1.0, 0.0], []], [28, 32, 32], comps, max_new_tokens=32, buffer=8, penalty=2.0)
    assert got == [0.0, [1.0, -2.0], []] and comps == [{"overlong": -1.0}, {"overlong": -2.0}, {"overlong": -2.0}]
    off = [{}]
    assert add_overlong_penalty([1.0], [32], off, max_new_tokens=32, buffer=8, penalty=0.0) == [1.0] and off == [{}]


def test_a_truncated_output_leaves_the_loss_entirely(grpo_cache_dir):
    """update() with mask_truncated on an ended and a truncated output gives the gradient of the ended one alone."""
    spec = validate_spec({**RUN, "group_size": 2, "batch_size": 1, "mask_truncated": True, "kl_coef": 0.0})
    learner = loading.load_learner(spec, MemoryRecorder(), grpo_cache_dir, "cpu")[0]
    prompts = encode_prompts(learner.tokenizer, ["2+3*4"], learner.dev, learner.prompt)
    pieces = learner.tokenizer(["3 * 4 = 12", "2 + 3 = 5 5 * 4"], add_special_tokens=False)["input_ids"]
    eos = learner.end_ids[0]
    completions = torch.tensor([pieces[0] + [eos], pieces[1][: len(pieces[0]) + 1]])  # (2, T): ended, truncated
    mask, ended = completion_mask(completions, learner.end_ids)
    assert ended.tolist() == [True, False]
    start = copy.deepcopy(learner.unwrapped().state_dict())

    def gradient(rows: slice, truncated_masked: bool):
        learner.unwrapped().load_state_dict(start)
        learner.spec = validate_spec({**spec.to_dict(), "mask_truncated": truncated_masked})
        s = Sampled(
            batch=[{}],
            prompt_ids=prompts["input_ids"].repeat(2, 1)[rows],
            prompt_attn=prompts["attention_mask"].repeat(2, 1)[rows],
            completions=completions[rows],
            mask=mask[rows],
            ended=ended[rows],
        )
        advantages = torch.tensor([[1.0], [-1.0]])[rows] * s.mask
        chunks = plan_micro_batches(s.mask, s.prompt_attn, 2, 0)
        sums = update(learner, s, advantages, ref_logp=None, old_logp=None, chunks=chunks)
        return [p.grad.clone() for p in learner.params], sums["tokens"]

    both, tokens = gradient(slice(0, 2), True)
    alone, alone_tokens = gradient(slice(0, 1), False)
    assert tokens == alone_tokens == len(pieces[0]) + 1
    assert all(torch.allclose(g, h, atol=1e-7) for g, h in zip(both, alone, strict=True))
    with_it, _ = gradient(slice(0, 2), False)
    assert not all(torch.allclose(g, h, atol=1e-7) for g, h in zip(with_it, alone, strict=True))  # the test can fail


# --- the learning-rate schedule ----------------------------------------------------------------


@pytest.mark.parametrize(
    "schedule, expected",
    [
        # base 1.0, 10 steps, warm-up 2: 0.5, 1.0; then p = (step - 2) / 8
        ("constant", [0.5, 1.0, 1.0, 1.0, 1.0]),
        ("linear", [0.5, 1.0, 1.0, 0.5, 0.125]),  # 1 - p at p = 0, 4/8, 7/8
        ("cosine", [0.5, 1.0, 1.0, 0.5, 0.0380602]),  # 0.5 (1 + cos(pi p)): cos(7 pi / 8) = -0.9238795
    ],
)
def test_learning_rate_at_chosen_steps(schedule, expected):
    got = [learning_rate_at(s, 10, 1.0, 2, schedule) for s in (0, 1, 2, 6, 9)]
    assert got == pytest.approx(expected, abs=1e-7)


def test_no_warmup_and_constant_is_the_base_rate_at_every_step():
    assert {learning_rate_at(s, 5, 2e-4, 0, "constant") for s in range(5)} == {2e-4}
    assert learning_rate_at(0, 4, 1.0, 0, "linear") == 1.0 and learning_rate_at(3, 4, 1.0, 0, "linear") == 0.25


# --- run-spec keys: defaults and refusals --------------------------------------------------------


def test_the_defaults_are_the_paper():
    spec = validate_spec({})
    assert (spec.skip_zero_spread, spec.max_resample, spec.mask_truncated, spec.overlong_penalty) == (
        False,
        4,
        False,
        0.0,
    )
    assert (spec.overlong_buffer, spec.lr_warmup_steps, spec.lr_schedule) == (8, 0, "constant")


@pytest.mark.parametrize(
    "values, key",
    [
        ({"max_resample": 8}, "max_resample"),
        ({"max_resample": 65, "skip_zero_spread": True}, "max_resample"),
        ({"overlong_penalty": 1.0, "overlong_buffer": 32}, "overlong_buffer"),
        ({"overlong_penalty": 1.0, "max_new_tokens": 8}, "overlong_buffer"),
        ({"overlong_buffer": 4}, "overlong_buffer"),
        ({"overlong_penalty": -1.0}, "overlong_penalty"),
        ({"lr_warmup_steps": 200}, "lr_warmup_steps"),
        ({"lr_warmup_steps": 6, "iterations": 2, "steps_per_iteration": 3}, "lr_warmup_steps"),
        ({"lr_schedule": "step"}, "lr_schedule"),
        ({"skip_zero_spread": "yes"}, "skip_zero_spread"),
    ],
)
def test_bad_values_are_refused_naming_the_key(values, key):
    with pytest.raises(SpecError) as info:
        validate_spec(values)
    assert info.value.key == key


def test_accepted_combinations():
    validate_spec({"skip_zero_spread": True, "max_resample": 0})
    validate_spec({"overlong_penalty": 0.5, "overlong_buffer": 31, "max_new_tokens": 32})
    validate_spec({"lr_warmup_steps": 5, "iterations": 2, "steps_per_iteration": 3, "lr_schedule": "cosine"})


def test_the_memory_estimate_counts_no_reference_without_a_kl_term():
    with_ref = estimate_memory(1000, 1000, lora=False, bf16=True)
    without = estimate_memory(1000, 1000, lora=False, bf16=True, reference=False)
    assert (with_ref.reference, without.reference, with_ref.total - without.total) == (2000, 0, 2000)


# --- short real runs ---------------------------------------------------------------------------


def test_a_batch_without_signal_leaves_the_policy_unchanged(grpo_cache_dir):
    """Every output cut at 16 tokens is wrong: every advantage is 0, so the optimizer does not step (AdamW would
    still move the weights: the KL term's gradient divided by its running scale); the update's metrics are still
    measured, and the step counts itself in update/skipped."""
    spec = validate_spec({**RUN, "kl_coef": 0.04})
    learner, train_set = loading.load_learner(spec, MemoryRecorder(), grpo_cache_dir, "cpu")[:2]
    before = copy.deepcopy(learner.unwrapped().state_dict())
    result = grpo_step(learner, [train_set[i] for i in range(spec.batch_size)], record=False)
    assert result.metrics["zero_std_frac"] == 1.0 and result.metrics["update/skipped"] == 1.0
    assert {"loss", "kl", "grad_norm"} <= set(result.metrics)
    after = learner.unwrapped().state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not learner.optimizer.state  # AdamW never stepped


@pytest.mark.parametrize("max_new_tokens", [24, 16])  # the built-in outputs take ~20 tokens: at 16 none is right
def test_skip_zero_spread_trains_on_groups_whose_rewards_differ(grpo_cache_dir, max_new_tokens):
    result, rec, _ = run(grpo_cache_dir, skip_zero_spread=True, max_resample=3, max_new_tokens=max_new_tokens)
    assert result.status == "completed"
    for m in rec.metrics:
        groups = rec.group_log[m["step"]]
        informative = m["sampling/drawn"] - m["sampling/dropped"]
        assert m["sampling/drawn"] >= 2 and m["sampling/dropped"] >= 0
        if "loss" in m:  # trained on the informative groups found, at most B
            assert len(groups) == min(2, informative) >= 1
            assert all(len({s.reward for s in g.samples}) > 1 for g in groups)
        else:  # none found in the 1 + 3 draws: no update, the step's own groups recorded
            assert informative == 0 and len(groups) == 2 and "grad_norm" not in m
    if max_new_tokens == 24:  # (seed 0) some steps resampled, and every step found a group to learn from
        assert any(m["sampling/drawn"] > 2 for m in rec.metrics) and all("loss" in m for m in rec.metrics)
    else:  # every draw all wrong: 1 + 3 draws of 2 groups a step, no update ever
        assert all(m["sampling/drawn"] == m["sampling/dropped"] == 8 and "loss" not in m for m in rec.metrics)


def test_default_runs_record_every_group_and_drop_none(grpo_cache_dir):
    _, rec, learner = run(grpo_cache_dir, steps_per_iteration=1)
    assert rec.metrics[-1]["sampling/drawn"] == 2 and rec.metrics[-1]["sampling/dropped"] == 0
    assert learner.reference is not None  # kl_coef 0.04: the frozen copy


def test_mask_truncated_and_overlong_penalty_run(grpo_cache_dir):
    result, rec, _ = run(
        grpo_cache_dir,
        mask_truncated=True,
        overlong_penalty=0.5,
        overlong_buffer=8,
        max_new_tokens=20,
        steps_per_iteration=2,
    )
    assert result.status == "completed"
    samples = [s for groups in rec.group_log.values() for g in groups for s in g.samples]
    lengths = [len(s.tokens) for s in samples]  # the tokens, end token included
    assert max(lengths) == 20 and min(lengths) < 20  # some cut, some not (outputs take ~20 tokens)
    for s, n in zip(samples, lengths, strict=True):
        assert s.reward_components["overlong"] == overlong_penalty(n, 20, 8, 0.5)
        assert s.reward == pytest.approx(s.reward_components["correct"] + s.reward_components["overlong"])
    assert all(math.isfinite(v) for m in rec.metrics for v in m.values())


def test_a_learned_orms_score_is_recorded_without_the_overlong_penalty(grpo_cache_dir):
    result, rec, _ = run(
        grpo_cache_dir,
        reward="model",
        rm_samples=16,
        overlong_penalty=0.5,
        overlong_buffer=8,
        max_new_tokens=20,
        steps_per_iteration=1,
    )
    assert result.status == "completed"
    for s in (s for groups in rec.group_log.values() for g in groups for s in g.samples):
        assert 0.0 < s.reward_components["rm_score"] < 1.0  # the ORM's own score, a probability
        assert s.reward == pytest.approx(s.reward_components["rm_score"] + s.reward_components["overlong"])


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_kl_coef_zero_keeps_no_reference_over_two_iterations(grpo_cache_dir, lora_rank):
    result, rec, learner = run(grpo_cache_dir, kl_coef=0.0, iterations=2, steps_per_iteration=2, lora_rank=lora_rank)
    assert result.status == "completed" and result.step == 4
    assert learner.reference is None
    assert [m["iteration"] for m in rec.metrics] == [1, 1, 2, 2] and all(m["kl"] == 0.0 for m in rec.metrics)
    assert not any("reference" in line for line in rec.messages if line.startswith("memory estimate"))


def test_kl_coef_zero_run_resumes_from_its_checkpoint(grpo_cache_dir, tmp_path):
    straight, first, second = straight_and_resumed(
        grpo_cache_dir, tmp_path, pause_at=4, kl_coef=0.0, iterations=2, steps_per_iteration=3
    )
    assert_same_metrics(straight, first, second, pause_at=4)


def test_the_recorded_learning_rate_follows_the_schedule_across_lora_iterations(grpo_cache_dir):
    # LoRA makes a new optimizer at iteration 2 (step 3): it too trains at the scheduled rate
    _, rec, _ = run(
        grpo_cache_dir,
        lora_rank=4,
        iterations=2,
        steps_per_iteration=2,
        lr_warmup_steps=1,
        lr_schedule="cosine",
        learning_rate=2e-4,
    )
    got = [m["learning_rate"] for m in rec.metrics]
    assert got == pytest.approx([learning_rate_at(s, 4, 2e-4, 1, "cosine") for s in range(4)], rel=1e-12)
    assert got == pytest.approx([2e-4, 2e-4, 1.5e-4, 0.5e-4])  # p = 0, 1/3, 2/3 after the 1-step warm-up
