"""A question tried by hand (grpo_engine/rollout/tries.py) on the built-in model: G outputs sampled as the run
samples, each token's log-prob checked against a plain forward of the whole sequence, the verifier's reading and
the run's rewards, and the seed's own stream."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from grpo_engine.model.model import load_policy
from grpo_engine.rewards.rewards import final_answer, reading_reward
from grpo_engine.rollout.tokenization import run_prompt
from grpo_engine.rollout.tries import try_outputs
from grpo_engine.spec.config import validate_spec

QUESTION, REFERENCE = "What is 3 + 4 * 2?", "4 * 2 = 8\n3 + 8 = 11\n#### 11"


@pytest.fixture(scope="module")
def policy(grpo_cache_dir):
    return load_policy("builtin-arith", Path(grpo_cache_dir), torch.device("cpu"))


def tried(policy, spec: dict, reference: str = REFERENCE, seed: int = 0, g: int = 4):
    model, tokenizer = policy
    return try_outputs(model, tokenizer, validate_spec(spec), QUESTION, reference, g=g, max_new_tokens=40, seed=seed)


def test_each_tokens_logprob_is_the_models_at_the_runs_temperature(policy):
    model, tokenizer = policy
    spec = {"temperature": 0.7, "format_reward": 0.1}
    outputs = tried(policy, spec)
    assert len(outputs) == 4
    prompt = run_prompt(tokenizer, validate_spec(spec))(QUESTION)
    for out in outputs:
        assert len(out["logprobs"]) == len(out["tokens"]) and all(v <= 0 for v in out["logprobs"])
        assert "".join(out["tokens"][: len(out["tokens"]) - out["ended"]]) == out["completion"]
        assert len(out["token_ids"]) == len(out["tokens"]) and out["ended"] == (
            out["token_ids"][-1] == tokenizer.eos_token_id
        )
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        ids = torch.tensor([prompt_ids + out["token_ids"]])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, :-1] / 0.7
        n = len(out["logprobs"])
        expected = torch.log_softmax(logits[-n:].double(), dim=-1).gather(1, ids[0, -n:, None]).squeeze(1)
        assert out["logprobs"] == pytest.approx(expected.tolist(), abs=2e-3)


def test_each_output_is_read_and_scored_as_the_run_does(policy):
    outputs = tried(policy, {"format_reward": 0.1, "answer_match": "flexible"})
    for out in outputs:
        assert (out["answer"], out["answer_rule"]) == final_answer(out["completion"], "flexible")
        reward, components = reading_reward((out["answer"], out["answer_rule"]), REFERENCE, 0.1)
        assert out["reward"] == pytest.approx(reward) and out["components"] == components
    named = tried(policy, {"rewards": [{"name": "accuracy", "weight": 2.0}, {"name": "length", "weight": 0.5}]})
    for out in named:
        parts = out["components"]
        assert out["reward"] == pytest.approx(2.0 * parts["accuracy"] + 0.5 * parts["length"])
        assert parts["accuracy"] == parts["correct"]


def test_without_a_reference_the_verdict_is_not_judged(policy):
    assert all(out["components"]["correct"] is None for out in tried(policy, {}, reference=" "))


def test_a_seed_gives_the_same_outputs_and_leaves_the_callers_stream(policy):
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    first = tried(policy, {"temperature": 1.5}, seed=7, g=6)
    assert torch.equal(torch.rand(1), before)  # the caller's stream as it was
    assert tried(policy, {"temperature": 1.5}, seed=7, g=6) == first
    assert tried(policy, {"temperature": 1.5}, seed=8, g=6) != first


def test_a_try_past_its_deadline_stops_inside_sampling(policy):
    model, tokenizer = policy
    with pytest.raises(TimeoutError, match="new tokens"):
        try_outputs(model, tokenizer, validate_spec({}), QUESTION, REFERENCE, g=4, max_new_tokens=40, seed=0,
                    deadline=time.monotonic())  # fmt: skip


@pytest.mark.gpu
def test_a_try_on_a_gpu_is_read_and_scored_as_on_the_cpu(grpo_cache_dir):
    """The policy on CUDA: every tensor of the try on its device; outputs read and scored as on the CPU path."""
    model, tokenizer = load_policy("builtin-arith", Path(grpo_cache_dir), torch.device("cuda"))
    spec = validate_spec({"format_reward": 0.1})
    outputs = try_outputs(model, tokenizer, spec, QUESTION, REFERENCE, g=4, max_new_tokens=40, seed=0)
    for out in outputs:
        assert len(out["logprobs"]) == len(out["tokens"]) and all(v <= 0 for v in out["logprobs"])
        assert (out["answer"], out["answer_rule"]) == final_answer(out["completion"], "strict")
        assert out["reward"] == pytest.approx(reading_reward((out["answer"], out["answer_rule"]), REFERENCE, 0.1)[0])
