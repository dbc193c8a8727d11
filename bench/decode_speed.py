"""The engine's sampler against transformers' ``generate`` on SmolLM2-135M-Instruct: same prompts, same lengths.

Both sample B word problems (builtin-word-problems' questions, worded by bench/real_model.py's question_template, in the
model's chat template) G times each, fp32 on the CPU, temperature 0.7, top-p 1, no top-k, in inference mode:

  engine    grpo_engine.rollout.sampling.generate (the run's sampler, ``--decode`` dynamic or static): each prompt
            prefilled once and its KV cache repeated G times; ended rows dropped as they accumulate
  generate  model.generate on the N = B x G rows (each prompt repeated G times, as TRL calls it)

Two rounds, each timed --repeats times (the median shown):

  fixed     every completion exactly --new-tokens tokens (no end token stops the engine; ``min_new_tokens``
            holds generate's back): both do the same decoding work, N x T tokens
  real      both stop at the model's end tokens (<|im_end|>), as in training; their completions' lengths
            differ by chance, so the line also prints tokens per second

FLOPs: 2 n per token fed to the model (n = parameters, attention's score products left out): the prefill
(B x P for the engine, N x P for generate) plus one token per row not yet ended at each step (a lower bound:
generate feeds ended rows to the last step, the engine until it drops them).

    .venv/bin/python -m bench.decode_speed                    # B 4, G 8, 160 tokens (bench/real_model.py's)
    .venv/bin/python -m bench.decode_speed --batch-size 2 --new-tokens 64 --repeats 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from bench.harness import smollm2_arguments, smollm2_dir, word_problem_prompts

NEVER = [-1]  # an end-token id no sampled token equals: the fixed round's engine runs to --new-tokens


def timed(fn, repeats: int, seed: int):
    """(median seconds, the last result) of ``repeats`` calls of ``fn``, each seeded alike."""
    import torch

    seconds, out = [], None
    for _ in range(repeats):
        torch.manual_seed(seed)
        t0 = time.perf_counter()
        out = fn()
        seconds.append(time.perf_counter() - t0)
    return statistics.median(seconds), out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    smollm2_arguments(parser)
    parser.add_argument("--batch-size", type=int, default=4, help="B: distinct prompts")
    parser.add_argument("--group-size", type=int, default=8, help="G: completions per prompt")
    parser.add_argument("--new-tokens", type=int, default=160)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--decode", default="dynamic", choices=("dynamic", "static"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch

    from grpo_engine.model.model import load_causal_lm
    from grpo_engine.rollout.sampling import generate
    from grpo_engine.rollout.tokenization import completion_mask, end_token_ids

    model, tokenizer = load_causal_lm(str(smollm2_dir(args.gguf, Path(args.cache_dir).expanduser().resolve())))
    model.eval()
    tokenizer.padding_side = "left"
    n_params = sum(p.numel() for p in model.parameters())
    ends = end_token_ids(model, tokenizer)
    B, G, T = args.batch_size, args.group_size, args.new_tokens
    prompts = word_problem_prompts(tokenizer, B)
    P = prompts["input_ids"].shape[1]
    print(
        f"SmolLM2-135M-Instruct, {n_params:,} parameters, fp32 on {torch.get_num_threads()} CPU threads "
        f"({os.cpu_count()} cores); B {B} x G {G} = {B * G} rows, prompts padded to {P} tokens, up to {T} new "
        f"tokens, temperature {args.temperature}; median of {args.repeats}",
        flush=True,
    )

    def engine(end_ids):
        return generate(
            model,
            tokenizer,
            prompts,
            repeat=G,
            max_new_tokens=T,
            greedy=False,
            temperature=args.temperature,
            end_ids=end_ids,
            decode=args.decode,
        )

    def hf(fixed: bool):
        with torch.inference_mode():
            out = model.generate(
                input_ids=prompts["input_ids"].repeat_interleave(G, dim=0),
                attention_mask=prompts["attention_mask"].repeat_interleave(G, dim=0),
                do_sample=True,
                temperature=args.temperature,
                top_p=1.0,
                top_k=0,
                max_new_tokens=T,
                min_new_tokens=T if fixed else 0,
                eos_token_id=ends,
                pad_token_id=tokenizer.pad_token_id,
            )
        return out[:, P:]

    for round_, fixed in (("fixed", True), ("real", False)):
        rows = {}
        for name, fn in (
            ("engine", lambda fixed=fixed: engine(NEVER if fixed else ends)),
            ("generate", lambda fixed=fixed: hf(fixed)),
        ):
            seconds, out = timed(fn, args.repeats, args.seed)
            lengths = completion_mask(out, ends)[0].sum(dim=1) if not fixed else torch.full((B * G,), out.shape[1])
            tokens = int(lengths.sum())
            decoded = sum(int((lengths > t).sum()) for t in range(out.shape[1]))  # rows fed at each step
            prefill = (B if name == "engine" else B * G) * P
            rows[name] = seconds
            print(
                f"{round_:<5} {name:<8} {seconds:7.2f} s  {tokens:5d} new tokens ({tokens / (B * G):5.1f} a row)  "
                f"{tokens / seconds:7.1f} tokens/s  {2 * n_params * (prefill + decoded) / seconds / 1e9:6.1f} GFLOP/s "
                f"(prefill {prefill} + decode {decoded} tokens)",
                flush=True,
            )
        print(f"{round_:<5} generate / engine time: {rows['generate'] / rows['engine']:.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
