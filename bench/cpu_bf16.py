"""bf16 autocast against fp32 on this CPU, for sampling and for the update, on SmolLM2-135M-Instruct: what
``precision: auto`` chooses here, and why.

Three timings per precision, each the median of --repeats after one warm-up:

  matmul    a 2048 x 2048 matmul (bf16 tensors against fp32 ones)
  sampling  grpo_engine.rollout.sampling.generate: B prompts x G, --new-tokens tokens each (no end token stops it),
            under torch.autocast for bf16, as a sampler in bf16 would run
  update    the log-prob pass and its backward on the same B x G rows (grpo_engine.rollout.forwards, the update's
            code path), under Learner.autocast's context for bf16

The last line says what ``precision: auto`` picks on this CPU (grpo_engine.train.placement.cpu_bf16_is_fast: the
avx512_bf16 or amx_bf16 flag) and the speed-ups measured: bf16 pays off for the update only where the CPU has
those instructions; elsewhere it is emulated, and slower.

    .venv/bin/python -m bench.cpu_bf16
    .venv/bin/python -m bench.cpu_bf16 --batch-size 2 --new-tokens 32 --repeats 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

from bench.harness import smollm2_arguments, smollm2_dir, word_problem_prompts


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    seconds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - t0)
    return statistics.median(seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    smollm2_arguments(parser)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import torch

    from grpo_engine.model.model import load_causal_lm
    from grpo_engine.rollout.forwards import micro_batch_logprobs, plan_micro_batches
    from grpo_engine.rollout.sampling import generate
    from grpo_engine.train.placement import cpu_bf16_is_fast, resolve_precision

    model, tokenizer = load_causal_lm(str(smollm2_dir(args.gguf, Path(args.cache_dir).expanduser().resolve())))
    tokenizer.padding_side = "left"
    B, G, T = args.batch_size, args.group_size, args.new_tokens
    prompts = word_problem_prompts(tokenizer, B)
    torch.manual_seed(0)
    completions = generate(
        model.eval(), tokenizer, prompts, repeat=G, max_new_tokens=T, greedy=False, temperature=0.7, end_ids=[-1]
    )
    mask = torch.ones(completions.shape)  # every row T tokens long (no end token stopped it)
    prompt_ids, prompt_attn = (prompts[k].repeat_interleave(G, dim=0) for k in ("input_ids", "attention_mask"))
    chunks = plan_micro_batches(mask, prompt_attn, G, 0)

    def contexts(bf16: bool):
        return torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext()

    def sampling(bf16: bool):
        with contexts(bf16):
            generate(
                model.eval(),
                tokenizer,
                prompts,
                repeat=G,
                max_new_tokens=T,
                greedy=False,
                temperature=0.7,
                end_ids=[-1],
            )

    def update(bf16: bool):
        model.train()
        for mb in chunks:
            with contexts(bf16):
                logp, _ = micro_batch_logprobs(
                    model,
                    mb,
                    prompt_ids=prompt_ids,
                    prompt_attn=prompt_attn,
                    completions=completions,
                    mask=mask,
                    temperature=0.7,
                    entropy=True,
                )
            (logp * mask[mb.rows]).sum().backward()
        model.zero_grad(set_to_none=True)

    a32, b32 = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a16, b16 = a32.bfloat16(), b32.bfloat16()
    print(
        f"SmolLM2-135M-Instruct fp32 weights on {torch.get_num_threads()} CPU threads; B {B} x G {G} rows, "
        f"{prompts['input_ids'].shape[1]}-token prompts, {T} new tokens; median of {args.repeats}",
        flush=True,
    )
    times = {}
    for name, fn in (
        ("matmul", lambda bf16: (a16 @ b16) if bf16 else (a32 @ b32)),
        ("sampling", sampling),
        ("update", update),
    ):
        fp32, bf16 = (median_seconds(lambda fn=fn, x=x: fn(x), args.repeats) for x in (False, True))
        times[name] = fp32 / bf16
        print(f"{name:<9} fp32 {fp32:8.3f} s   bf16 {bf16:8.3f} s   bf16 speed-up {fp32 / bf16:5.2f}x", flush=True)
    fast = cpu_bf16_is_fast()
    plan = resolve_precision("auto", "cpu", fast)
    print(
        f"this CPU lists avx512_bf16 / amx_bf16: {'yes' if fast else 'no'}; precision auto here: "
        f"{plan.describe()} "
        f"(measured bf16 speed-up: update {times['update']:.2f}x, sampling {times['sampling']:.2f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
