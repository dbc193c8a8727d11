"""The lean decode loop (grpo_engine/rollout/sampling.py) against transformers' own generate and hand numbers."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
import torch

from grpo_engine.data.data import load_dataset
from grpo_engine.model.model import load_policy
from grpo_engine.rollout import sampling
from grpo_engine.rollout.outputs import encode_prompts as _encode_prompts
from grpo_engine.rollout.sampling import BlockLayer, generate, next_tokens, top_p_filter
from grpo_engine.rollout.tokenization import completion_mask


def test_top_p_keeps_the_smallest_nucleus():
    # probabilities 0.5, 0.3, 0.15, 0.05 (in shuffled order): top_p 0.8 keeps 0.5 + 0.3; 0.81 also keeps 0.15
    probs = torch.tensor([[0.15, 0.5, 0.05, 0.3]])
    logits = probs.log()
    kept = top_p_filter(logits, 0.8).isfinite()
    assert kept.tolist() == [[False, True, False, True]]
    assert top_p_filter(logits, 0.81).isfinite().tolist() == [[True, True, False, True]]
    assert top_p_filter(logits, 0.1).isfinite().tolist() == [[False, True, False, False]]  # the top token stays
    assert torch.equal(top_p_filter(logits, 1.0), logits)


def test_sampled_tokens_follow_the_distribution():
    torch.manual_seed(0)
    probs = torch.tensor([0.5, 0.0, 0.3, 0.15, 0.05, 0.0])
    logits = probs.clamp(min=1e-30).log().masked_fill(probs == 0, float("-inf")).expand(200_000, -1)
    counts = torch.bincount(next_tokens(logits, greedy=False, temperature=1.0, top_p=1.0), minlength=6).float()
    share = counts / counts.sum()
    assert share[1] == 0 and share[5] == 0  # probability 0 is never drawn
    for p, s in zip(probs.tolist(), share.tolist(), strict=True):
        assert abs(s - p) < 4 * math.sqrt(p * (1 - p) / 200_000) + 1e-9
    # temperature 2 flattens: p^(1/2) renormalised
    hot = torch.bincount(next_tokens(logits, greedy=False, temperature=2.0, top_p=1.0), minlength=6).float()
    expected = probs.sqrt() / probs.sqrt().sum()
    assert torch.allclose(hot / hot.sum(), expected, atol=0.01)
    assert next_tokens(logits[:3], greedy=True, temperature=1.0, top_p=1.0).tolist() == [0, 0, 0]


@pytest.fixture(scope="module")
def policy(grpo_cache_dir):
    model, tokenizer = load_policy("builtin-arith", Path(grpo_cache_dir), torch.device("cpu"))
    return model.eval(), tokenizer


def test_greedy_decoding_matches_transformers_generate(policy):
    model, tokenizer = policy
    _, heldout = load_dataset("builtin-arith")
    questions = [e["question"] for e in heldout[:44]] + ["3+4", "12*3", "5-2+7*3-1", "100+200+300"]
    prompts = _encode_prompts(tokenizer, questions, "cpu")
    assert (prompts["attention_mask"] == 0).any()  # prompts of different lengths: left padding is exercised
    ours = generate(model, tokenizer, prompts, repeat=1, max_new_tokens=40, greedy=True)
    ids, attn = prompts["input_ids"], prompts["attention_mask"]
    theirs = model.generate(
        input_ids=ids,
        attention_mask=attn,
        max_new_tokens=40,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )[:, ids.shape[1] :]
    assert torch.equal(ours, theirs)


def test_a_block_layer_holds_what_a_dynamic_layer_holds(monkeypatch):
    """BlockLayer against transformers' DynamicLayer through the decode loop's calls: a prefill, a repeat per
    group, steps that outgrow the buffer (blocks of 2 positions), a pruning of rows, a prefill of 3 positions."""
    from transformers.cache_utils import DynamicLayer

    monkeypatch.setattr(sampling, "CACHE_BLOCK", 2)
    g = torch.Generator().manual_seed(0)
    states = lambda n, s: (torch.randn(n, 2, s, 4, generator=g), torch.randn(n, 2, s, 4, generator=g))  # noqa: E731
    plain = DynamicLayer()
    plain.update(*states(3, 5))
    block = BlockLayer(plain)
    for layer in (plain, block):
        layer.batch_repeat_interleave(2)
    for t in range(7):
        new = states(6 if t < 4 else 4, 1 if t != 2 else 3)
        if t == 4:
            keep = torch.tensor([0, 2, 3, 5])
            plain.batch_select_indices(keep)
            block.batch_select_indices(keep)
        expected, got = plain.update(*new), block.update(*new)
        assert block.get_seq_length() == plain.get_seq_length()
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


def test_greedy_decoding_is_the_same_when_the_cache_grows_block_by_block(policy, monkeypatch):
    """Blocks of 3 positions: the cache is reallocated many times during the loop, with groups and finished rows
    dropped; the outputs are transformers' generate's, each prompt's repeated."""
    model, tokenizer = policy
    monkeypatch.setattr(sampling, "CACHE_BLOCK", 3)
    _, heldout = load_dataset("builtin-arith")
    questions = [e["question"] for e in heldout[:12]] + ["3+4", "5-2+7*3-1"]
    prompts = _encode_prompts(tokenizer, questions, "cpu")
    ours = generate(model, tokenizer, prompts, repeat=2, max_new_tokens=30, greedy=True)
    ids = prompts["input_ids"].repeat_interleave(2, dim=0)
    attn = prompts["attention_mask"].repeat_interleave(2, dim=0)
    theirs = model.generate(
        input_ids=ids,
        attention_mask=attn,
        max_new_tokens=30,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )[:, ids.shape[1] :]
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("repeat,max_new_tokens", [(1, 40), (3, 40), (2, 5)])
def test_the_static_decode_gives_the_dynamic_decodes_greedy_outputs(policy, repeat, max_new_tokens):
    """decode 'static' (StaticCache, full-width mask, no rows dropped) against the default loop, with left padding,
    groups and outputs cut at max_new_tokens (5). 'compiled' is the same loop through torch.compile: test_gpu.py."""
    model, tokenizer = policy
    _, heldout = load_dataset("builtin-arith")
    prompts = _encode_prompts(tokenizer, [e["question"] for e in heldout[:10]] + ["3+4", "5-2+7*3-1"], "cpu")
    assert (prompts["attention_mask"] == 0).any()
    dynamic = generate(model, tokenizer, prompts, repeat=repeat, max_new_tokens=max_new_tokens, greedy=True)
    static = generate(
        model, tokenizer, prompts, repeat=repeat, max_new_tokens=max_new_tokens, greedy=True, decode="static"
    )
    assert torch.equal(static, dynamic)
    assert completion_mask(dynamic, tokenizer.eos_token_id)[1].any() == (max_new_tokens == 40)


@pytest.mark.parametrize("decode", ["dynamic", "static"])
def test_a_passed_deadline_stops_sampling_between_two_tokens(policy, decode):
    """A deadline already passed: the first token is drawn from the prefill, the second decode step is not started.
    A deadline far ahead changes nothing."""
    model, tokenizer = policy
    prompts = _encode_prompts(tokenizer, ["5-2+7*3-1"], "cpu")
    how = {"repeat": 2, "max_new_tokens": 30, "greedy": True, "decode": decode}
    with pytest.raises(TimeoutError, match="after 1 of 30 new tokens"):
        generate(model, tokenizer, prompts, deadline=time.monotonic(), **how)
    later = generate(model, tokenizer, prompts, deadline=time.monotonic() + 600, **how)
    assert torch.equal(later, generate(model, tokenizer, prompts, **how))


def test_sampled_groups_end_at_eos_and_pad_after_it(policy):
    model, tokenizer = policy
    _, heldout = load_dataset("builtin-arith")
    prompts = _encode_prompts(tokenizer, [e["question"] for e in heldout[:6]], "cpu")
    torch.manual_seed(1)
    out = generate(model, tokenizer, prompts, repeat=5, max_new_tokens=30, greedy=False, temperature=1.0, top_p=0.95)
    assert out.shape[0] == 30 and out.shape[1] <= 30
    mask, ended = completion_mask(out, tokenizer.eos_token_id)
    assert ended.all()  # the built-in model always ends its answer within 30 tokens
    lengths = mask.sum(dim=1).long()
    assert out.shape[1] == lengths.max()  # the loop stopped as soon as every output had ended
    for row, n in zip(out, lengths.tolist(), strict=True):
        assert row[n - 1] == tokenizer.eos_token_id
        assert (row[n:] == tokenizer.pad_token_id).all()
    assert len({tuple(r.tolist()) for r in out}) > 6  # sampling varies within a group
    # the same seed samples the same outputs
    torch.manual_seed(1)
    again = generate(model, tokenizer, prompts, repeat=5, max_new_tokens=30, greedy=False, temperature=1.0, top_p=0.95)
    assert torch.equal(out, again)
    # a cut at max_new_tokens leaves outputs that have not ended
    short = generate(model, tokenizer, prompts, repeat=2, max_new_tokens=3, greedy=False)
    assert short.shape == (12, 3) and not completion_mask(short, tokenizer.eos_token_id)[1].any()
