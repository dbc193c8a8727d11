"""The training forwards with each prompt run once per group (grpo_engine/rollout/forwards.py) against the flat forward
(outputs.token_logprobs, every sequence prompt + completion whole): the same log-probs and the same gradient of
every parameter, within 1e-5 in fp32, with left padding, prompts of unequal lengths, completions of uneven
lengths, LoRA, micro-batches (in sampling order and sorted by length) and 2 processes (gloo, DDP).
"""

from __future__ import annotations

import os
from contextlib import nullcontext

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from grpo_engine.rollout.forwards import in_step_order, micro_batch, micro_batch_logprobs, plan_micro_batches
from grpo_engine.rollout.outputs import token_logprobs
from workers.distributed import free_port

TOL = 1e-5
B, G, P, T, V = 3, 4, 9, 7, 61
PROMPT_LENGTHS = (9, 5, 2)  # left-padded to 9
COMPLETION_LENGTHS = (7, 2, 5, 1, 3, 3, 7, 6, 1, 4, 2, 5)  # real tokens of each of the N = 12 completions


def tiny_model(arch: str = "llama", seed: int = 0):
    """A 2-layer causal LM of ``arch`` with random weights (Qwen2: tied embeddings, 2 KV heads for 4 heads)."""
    size = dict(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
    )
    config = LlamaConfig(**size) if arch == "llama" else Qwen2Config(**size, tie_word_embeddings=True)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).float()


def batch(seed: int = 1):
    """A step's tensors: prompts (N, P) repeated G times, left-padded; completions (N, T) right-padded with 0."""
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(1, V, (B, P), generator=gen)
    attn = torch.ones(B, P, dtype=torch.long)
    for b, n in enumerate(PROMPT_LENGTHS):
        attn[b, : P - n] = 0
    prompts = prompts * attn
    mask = (torch.arange(T)[None] < torch.tensor(COMPLETION_LENGTHS)[:, None]).float()
    completions = torch.randint(1, V, (B * G, T), generator=gen) * mask.long()
    return prompts.repeat_interleave(G, 0), attn.repeat_interleave(G, 0), completions, mask


def weights(mask: torch.Tensor, seed: int = 2) -> torch.Tensor:
    """A loss weight per token (as advantages are), so each token's gradient counts differently."""
    return torch.randn(mask.shape, generator=torch.Generator().manual_seed(seed)) * mask


def flat(model, tensors, temperature=1.0):
    ids, attn, completions, mask = tensors
    return token_logprobs(model, ids, attn, completions, mask, temperature=temperature)


def shared(model, tensors, size: int, temperature=1.0):
    ids, attn, completions, mask = tensors
    plan = plan_micro_batches(mask, attn, G, size)
    tensors = dict(prompt_ids=ids, prompt_attn=attn, completions=completions, mask=mask)
    parts = [micro_batch_logprobs(model, mb, **tensors, temperature=temperature) for mb in plan]
    return in_step_order([p[0] for p in parts], plan), in_step_order([p[1] for p in parts], plan)


def logprobs_and_grads(model, forward, tensors):
    """(log-probs * mask, entropy * mask, {trainable parameter: gradient}) of a weighted sum of the log-probs."""
    mask = tensors[3]
    model.zero_grad(set_to_none=True)
    logp, entropy = forward()
    (logp * weights(mask)).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return (logp * mask).detach(), entropy * mask, grads


def assert_same(a, b):
    (logp_a, ent_a, grads_a), (logp_b, ent_b, grads_b) = a, b
    assert (logp_a - logp_b).abs().max() < TOL
    assert (ent_a - ent_b).abs().max() < TOL
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name in grads_a:
        assert (grads_a[name] - grads_b[name]).abs().max() < TOL, name
    assert max(g.abs().max() for g in grads_a.values()) > 1e-3  # a real gradient, not zeros compared


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("size", [0, 5, 3, 1])
def test_shared_prompts_give_the_flat_logprobs_and_gradients(arch, size):
    model, tensors = tiny_model(arch), batch()
    want = logprobs_and_grads(model, lambda: flat(model, tensors, 0.7), tensors)
    got = logprobs_and_grads(model, lambda: shared(model, tensors, size, 0.7), tensors)
    assert_same(got, want)


def test_shared_prompts_under_lora_give_the_flat_gradients_of_the_adapter():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        tiny_model(),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"], init_lora_weights=False),
    )
    tensors = batch()
    want = logprobs_and_grads(model, lambda: flat(model, tensors), tensors)
    got = logprobs_and_grads(model, lambda: shared(model, tensors, 5), tensors)
    assert all("lora_" in name for name in want[2])
    assert_same(got, want)
    with model.disable_adapter(), torch.no_grad():  # the reference: the base model, the adapter off
        torch.testing.assert_close(
            shared(model, tensors, 0)[0] * tensors[3], flat(model, tensors)[0] * tensors[3], rtol=0, atol=TOL
        )


def _ddp_process(rank: int, port: int, out_dir: str) -> None:
    """One of 2 processes: its half of the groups through a DDP-wrapped model, micro-batches of 3 with the
    gradient synchronised at the last one only (as step.update does); saves the averaged gradient."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        model = torch.nn.parallel.DistributedDataParallel(tiny_model())
        ids, attn, completions, mask = batch()
        half = slice(0, 2 * G) if rank == 0 else slice(2 * G, 3 * G)
        mine = (ids[half], attn[half], completions[half], mask[half])
        w = weights(mask)[half]
        plan = plan_micro_batches(mine[3], mine[1], G, 3)
        for k, mb in enumerate(plan):
            sync = k == len(plan) - 1
            with nullcontext() if sync else model.no_sync():
                logp, _ = micro_batch_logprobs(
                    model, mb, prompt_ids=mine[0], prompt_attn=mine[1], completions=mine[2], mask=mine[3]
                )
                (logp * w[mb.rows]).sum().backward()
        torch.save({n: p.grad for n, p in model.module.named_parameters()}, f"{out_dir}/grads-{rank}.pt")
    finally:
        dist.destroy_process_group()
    # The interpreter's teardown is skipped: freeing the DDP reducer, the gloo group's last owner, joins gloo's worker
    # thread while holding the GIL, and that thread can be waiting for the GIL to free its last work (seen once: the
    # process hung at exit after saving its gradients).
    os._exit(0)


def test_two_processes_average_the_flat_gradient(tmp_path):
    """Process 0 holds groups 0 and 1, process 1 group 2; DDP averages their gradients: half the flat gradient
    of the whole batch's weighted sum."""
    mp.spawn(_ddp_process, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    model, tensors = tiny_model(), batch()
    model.zero_grad()
    (flat(model, tensors)[0] * weights(tensors[3])).sum().div(2).backward()
    for rank in (0, 1):
        got = torch.load(tmp_path / f"grads-{rank}.pt")
        for name, p in model.named_parameters():
            assert (got[name] - p.grad).abs().max() < TOL, (rank, name)


def test_a_micro_batch_shares_its_groups_prompts_and_cuts_its_padding():
    lengths = torch.tensor([3, 7, 2, 6, 4, 5, 1, 1])
    attn = torch.tensor([[0, 0, 1, 1]] * 4 + [[0, 1, 1, 1]] * 4)
    mb = micro_batch(torch.tensor([5, 2, 3, 4]), lengths, attn, 4)
    assert mb.prompt_rows.tolist() == [0, 4] and mb.prompt_of.tolist() == [1, 0, 0, 1]
    assert (mb.prompt_start, mb.length) == (1, 6)  # column 0 is padding in both prompts; the longest is 6
    assert mb.tokens(4) == 2 * 3 + 4 * 6


def test_the_plan_keeps_groups_whole_unless_sorting_by_length_saves_tokens():
    """The docstring's example: G 2, micro-batches of 2, lengths 8, 1, 8, 1."""
    mask = (torch.arange(8)[None] < torch.tensor([8, 1, 8, 1])[:, None]).float()
    for prompt_len, rows in ((10, [[0, 1], [2, 3]]), (1, [[0, 2], [1, 3]])):
        attn = torch.ones(4, prompt_len, dtype=torch.long)
        plan = plan_micro_batches(mask, attn, 2, 2)
        assert [mb.rows.tolist() for mb in plan] == rows, prompt_len
    whole = plan_micro_batches(mask, torch.ones(4, 10, dtype=torch.long), 2, 0)
    assert len(whole) == 1 and whole[0].tokens(10) == 2 * 10 + 4 * 8
    # every sequence in exactly one micro-batch, whatever the order
    _, attn, _, mask = batch()
    for size in (1, 3, 5):
        plan = plan_micro_batches(mask, attn, G, size)
        assert sorted(torch.cat([mb.rows for mb in plan]).tolist()) == list(range(B * G))
        assert all(len(mb.rows) <= size for mb in plan)
