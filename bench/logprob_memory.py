"""Memory of the policy update's log-probabilities with a large vocabulary.

With a 152k-token vocabulary (Qwen2's) the output layer's logits, not the transformer, set the
update's memory: N x T x V floats per tensor. This script builds a small Qwen2-architecture model with
that vocabulary (random weights; hidden 64, 2 layers, so the logits dominate) and runs one
``grpo_engine.train.step.token_logprobs`` forward and backward over N completions of T tokens after
P-token prompts, printing the rise of the process's peak resident memory (VmHWM, reset through
/proc/self/clear_refs just before; Linux only), the size of one (N, T, V) fp32 tensor for scale, and
the time.

    .venv/bin/python -m bench.logprob_memory
    .venv/bin/python -m bench.logprob_memory --n 32 --t 64
"""

from __future__ import annotations

import argparse
import time

from bench.harness import peak_rss, reset_peak_rss


def peak_mb() -> float:
    """This process's peak resident memory since the last reset, in MiB."""
    return peak_rss() / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=64, help="completions (B x G)")
    parser.add_argument("--p", type=int, default=8, help="prompt tokens")
    parser.add_argument("--t", type=int, default=32, help="completion tokens")
    parser.add_argument("--vocab", type=int, default=151936)
    args = parser.parse_args()

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo_engine.rollout.outputs import token_logprobs

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=args.vocab,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=True,
        )
    )
    prompt_ids = torch.randint(0, args.vocab, (args.n, args.p))
    prompt_attn = torch.ones(args.n, args.p, dtype=torch.long)
    completions = torch.randint(0, args.vocab, (args.n, args.t))
    mask = torch.ones(args.n, args.t)
    reset_peak_rss()
    before, start = peak_mb(), time.perf_counter()
    logp, entropy = token_logprobs(model, prompt_ids, prompt_attn, completions, mask)
    (logp * mask).sum().backward()
    seconds = time.perf_counter() - start
    one = args.n * args.t * args.vocab * 4 / 2**20
    print(f"N {args.n}, P {args.p}, T {args.t}, vocabulary {args.vocab:,}: one (N, T, V) fp32 tensor is {one:.0f} MB")
    print(
        f"forward + backward of token_logprobs: peak memory rise {peak_mb() - before:.0f} MB "
        f"({(peak_mb() - before) / one:.1f} such tensors), {seconds:.2f}s; mean entropy {entropy.mean().item():.4f}"
    )


if __name__ == "__main__":
    main()
