"""Peak memory of a full fine-tune against a LoRA run (``lora_rank`` > 0) of the same spec.

    .venv/bin/python -m bench.lora_memory                  # a fresh cache: includes creating the built-in model
    .venv/bin/python -m bench.lora_memory --cache-dir D    # reuse a built-in model cached in D
    .venv/bin/python -m bench.lora_memory --lora-rank 16 --builtin-steps 5

Two models: the built-in one (~0.6M parameters), and a ~25M-parameter Llama with random weights
and the built-in tokenizer, saved to a temporary directory (the spec's ``model`` takes a local
directory). Each (model, full | LoRA) pair runs ``grpo_engine.train.trainer.train`` on the built-in
dataset with the same spec except ``lora_rank``, each run in its own fresh Python process, so
nothing one run allocated is still held when the next one is measured.

What is measured, on CPU: the peak of the bytes held by live torch tensors during the run. The
run executes under ``torch.profiler`` with ``profile_memory=True``; torch's CPU allocator then
reports every allocation and free with its running total of live bytes, and the peak of that
total over the whole run counts everything the run allocated: the full fine-tune's reference copy
of the policy, gradients and AdamW state, the adapter with its gradients and state, activations,
KV caches and logits. The one thing the allocator does not see is the policy's own weights: the
loader memory-maps them from ``model.safetensors``. Both runs hold them (the LoRA run as the
frozen base, the full run as the weights it trains), so their size, read from the file, is added
to both figures and also printed on its own. Activations depend on how long the sampled
completions are, which differs between the two runs after step 1, so the bytes still live at the
end of a step (at most over the steps; weights, reference, gradients, optimizer state: what
training holds between steps) are printed as well; the recorder marks each step's end in the
profile with one allocation of an unusual size. Process RSS is not used: on CPU it is dominated by
the Python runtime and the profiler's own records, and the built-in model's gap is a few MB.
Evaluation is off (``eval_every`` 0): it is the same for both runs and not part of training.

With CUDA the runs train on the GPU, and what is printed instead is ``torch.cuda.max_memory_allocated``
of both runs (it counts the weights too, copied to the GPU).

Prints, per model: both peaks, their ratio, and what makes them up.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

from bench.harness import json_child

# Same spec for the full and the LoRA run of a model; only lora_rank differs. The 25M model is
# slow on CPU, so it runs fewer, smaller steps (AdamW state exists from the end of step 1 on).
BUILTIN_SPEC = dict(model="builtin-arith", eval_every=0)  # default batch 8 x group 8, 32 new tokens
LLAMA_SPEC = dict(eval_every=0, batch_size=2, group_size=4, max_new_tokens=16)
STEP_MARK = 1_234_567  # bytes of the allocation that marks a step's end in the profile
LLAMA_ARCH = dict(
    hidden_size=512,
    intermediate_size=1408,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=8,
    max_position_embeddings=128,
)
MB = 1e6


def measure(spec: dict, cache_dir: str) -> dict:
    """Run one spec in this process under the memory profiler; return what it held (the child's job)."""
    import peft  # noqa: F401  (the LoRA run imports it; import it for both so neither pays alone)
    import torch
    from safetensors import safe_open
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    from grpo_engine.model.model import resolve_model_path
    from grpo_engine.report.recorder import MemoryRecorder
    from grpo_engine.spec.config import validate_spec
    from grpo_engine.train.trainer import train

    run_spec = validate_spec(spec)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()

    class MarkingRecorder(MemoryRecorder):
        def step(self, step, iteration, metrics):
            super().step(step, iteration, metrics)
            torch.empty(STEP_MARK, dtype=torch.uint8)  # allocated and freed at once: its event holds the live total

    recorder = MarkingRecorder()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = train(run_spec, recorder, Path(cache_dir))
    assert result.status == "completed", result

    peak, held, stack = 0, 0, list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        if event.tag == _EventType.Allocation and event.extra_fields.device.type == "cpu":
            peak = max(peak, event.extra_fields.total_allocated)
            if event.extra_fields.alloc_size == STEP_MARK:
                held = max(held, event.extra_fields.total_allocated - STEP_MARK)
        stack.extend(event.children)

    weights = 0
    model_file = Path(resolve_model_path(run_spec.model, Path(cache_dir))) / "model.safetensors"
    with safe_open(str(model_file), framework="pt") as f:
        for key in f.keys():
            weights += f.get_tensor(key).nbytes
    counts = [re.search(r"([\d,]+) trainable parameters", m) for m in recorder.messages]
    trainable = next(int(c.group(1).replace(",", "")) for c in counts if c)
    return {
        "allocated_peak": peak,
        "held_between_steps": held,
        "weights": weights,
        "trainable": trainable,
        "cuda_peak": torch.cuda.max_memory_allocated() if cuda else None,
        "steps": result.step,
    }


def run_child(spec: dict, cache_dir: str) -> dict:
    """``measure`` in a fresh Python process; its last stdout line is the JSON result."""
    what = "the measuring process"
    return json_child("bench.lora_memory", "--child", json.dumps(spec), "--cache-dir", cache_dir, what=what)


def write_random_llama(out_dir: Path, cache_dir: str) -> int:
    """A ~25M-parameter Llama with random weights and the built-in tokenizer; returns its parameter count."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging

    from grpo_engine.model.model import builtin_model_dir

    logging.disable_progress_bar()
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(builtin_model_dir(Path(cache_dir)))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
        **LLAMA_ARCH,
    )
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return sum(p.numel() for p in model.parameters())


def compare(label: str, spec: dict, lora_rank: int, cache_dir: str) -> None:
    full = run_child({**spec, "lora_rank": 0}, cache_dir)
    lora = run_child({**spec, "lora_rank": lora_rank}, cache_dir)
    print(f"\n{label}: {full['steps']} steps of {json.dumps(spec)}")
    if full["cuda_peak"] is not None:
        for name, r in (("full fine-tune", full), (f"LoRA rank {lora_rank}", lora)):
            print(
                f"  {name:<15} CUDA max_memory_allocated {r['cuda_peak'] / MB:8.1f} MB; "
                f"{r['trainable']:,} trainable parameters"
            )
        print(
            f"  LoRA / full: {lora['cuda_peak'] / full['cuda_peak']:.3f} "
            f"({(full['cuda_peak'] - lora['cuda_peak']) / MB:.1f} MB less)"
        )
        return
    for name, r in (("full fine-tune", full), (f"LoRA rank {lora_rank}", lora)):
        total = r["allocated_peak"] + r["weights"]
        print(
            f"  {name:<15} peak {total / MB:8.1f} MB = weights {r['weights'] / MB:6.1f} MB (memory-mapped) "
            f"+ allocator peak {r['allocated_peak'] / MB:7.1f} MB; held between steps "
            f"{(r['held_between_steps'] + r['weights']) / MB:7.1f} MB; {r['trainable']:,} trainable parameters"
        )
    full_total = full["allocated_peak"] + full["weights"]
    lora_total = lora["allocated_peak"] + lora["weights"]
    print(f"  LoRA / full: {lora_total / full_total:.3f} ({(full_total - lora_total) / MB:.1f} MB less)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", help="built-in model cache (default: a temporary directory)")
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--builtin-steps", type=int, default=20, help="steps of the built-in model's runs")
    parser.add_argument("--llama-steps", type=int, default=3, help="steps of the 25M model's runs")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # a run spec: measure it in this process
    args = parser.parse_args()

    if args.child:
        print(json.dumps(measure(json.loads(args.child), args.cache_dir)))
        return 0

    with tempfile.TemporaryDirectory(prefix="grpo-lora-mem-") as tmp:
        cache_dir = args.cache_dir or str(Path(tmp) / "cache")
        from grpo_engine.model.model import builtin_model_dir

        builtin_model_dir(Path(cache_dir))
        compare(
            "built-in model", {**BUILTIN_SPEC, "steps_per_iteration": args.builtin_steps}, args.lora_rank, cache_dir
        )
        llama_dir = Path(tmp) / "llama-25m"
        n = write_random_llama(llama_dir, cache_dir)
        compare(
            f"random Llama, {n / 1e6:.1f}M parameters",
            {**LLAMA_SPEC, "model": str(llama_dir), "steps_per_iteration": args.llama_steps},
            args.lora_rank,
            cache_dir,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
