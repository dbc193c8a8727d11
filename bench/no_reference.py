"""What ``kl_coef: 0`` saves: no reference model is loaded and its forward pass is skipped.

    .venv/bin/python -m bench.no_reference                          # a fresh cache: builds the built-in model first
    .venv/bin/python -m bench.no_reference --cache-dir /tmp/bc      # reuse a built-in model cached there
    .venv/bin/python -m bench.no_reference --model DIR --steps 5    # any local causal LM directory instead
    .venv/bin/python -m bench.no_reference --steps 3 --repeats 1    # a quick look

Runs ``grpo_engine.train.trainer.train`` on the built-in dataset with the default spec (``kl_coef`` 0.04: a frozen copy of
the policy as reference) and with ``kl_coef`` 0, ``steps_per_iteration`` = --steps and ``eval_every`` 0, alternated
(default, kl 0, default, kl 0, ...) --repeats times each so that drift of a shared machine falls on both. Each run
is a fresh Python process, so each one's peak memory is its own: the peak resident set size (``VmHWM`` of
/proc/self/status, which psutil does not report; ``ru_maxrss`` where there is no /proc) and, on a GPU,
``torch.cuda.max_memory_allocated``. The built-in model's weights are memory-mapped, so with it the reference (a
copy of ~0.6M parameters) is a few MB against the hundreds the Python process holds; a larger --model shows the
saving (about 2 or 4 bytes per parameter, bf16 or fp32).

Prints, per configuration, the peak RSS (median over the repeats), the peak GPU memory when there is one, and the
median of every step's ``time/step`` metric; then what kl_coef 0 saves in both.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from bench.harness import json_child, peak_rss

CONFIGS = {"default (kl_coef 0.04)": {}, "kl_coef 0": {"kl_coef": 0.0}}
MB = 1e6


def child(spec: dict, cache_dir: str) -> dict:
    """One run in this process: its peak memory and step times (what the parent reads as JSON)."""
    import torch

    from grpo_engine.report.recorder import MemoryRecorder
    from grpo_engine.spec.config import validate_spec
    from grpo_engine.train.trainer import train

    recorder = MemoryRecorder()
    train(validate_spec(spec), recorder, Path(cache_dir))
    steps = [m["time/step"] for m in recorder.metrics if m["step"] >= 1]
    gpu = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None
    return {"peak_rss": peak_rss(), "peak_gpu": gpu, "step_seconds": steps}


def run_child(spec: dict, cache_dir: str) -> dict:
    """``child`` in a fresh Python process."""
    return json_child("bench.no_reference", "--child", json.dumps(spec), "--cache-dir", cache_dir, what="a run")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="builtin-arith", help="a local model directory (default: the built-in)")
    parser.add_argument("--steps", type=int, default=10, help="GRPO steps per run")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each configuration, alternated")
    parser.add_argument("--cache-dir", help="a model cache to reuse (default: a fresh temporary one)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    cache_dir = args.cache_dir or tempfile.mkdtemp(prefix="grpo-bench-")
    if args.child:
        print(json.dumps(child(json.loads(args.child), cache_dir)))
        return
    base = {"model": args.model, "steps_per_iteration": args.steps, "eval_every": 0, "checkpoint_every": 0}
    results: dict[str, list[dict]] = {name: [] for name in CONFIGS}
    for r in range(args.repeats):
        for name, overrides in CONFIGS.items():
            results[name].append(run_child({**base, **overrides}, cache_dir))
            print(
                f"repeat {r + 1}/{args.repeats}, {name}: peak RSS {results[name][-1]['peak_rss'] / MB:.1f} MB",
                flush=True,
            )
    summary = {}
    for name, runs in results.items():
        summary[name] = {
            "rss": statistics.median(x["peak_rss"] for x in runs),
            "gpu": statistics.median(x["peak_gpu"] for x in runs) if runs[0]["peak_gpu"] is not None else None,
            "step": statistics.median(s for x in runs for s in x["step_seconds"]),
        }
    print(f"\nmodel {args.model}, {args.steps} steps x {args.repeats} runs per configuration (medians)")
    for name, s in summary.items():
        gpu = f", peak GPU {s['gpu'] / MB:.1f} MB" if s["gpu"] is not None else ""
        print(f"  {name:24s} peak RSS {s['rss'] / MB:8.1f} MB{gpu}, time/step {s['step']:.3f} s")
    with_ref, without = summary["default (kl_coef 0.04)"], summary["kl_coef 0"]
    saved = f"saving: peak RSS {(with_ref['rss'] - without['rss']) / MB:.1f} MB"
    if with_ref["gpu"] is not None:
        saved += f", peak GPU {(with_ref['gpu'] - without['gpu']) / MB:.1f} MB"
    print(
        f"{saved}, time/step {100 * (1 - without['step'] / with_ref['step']):.1f}% "
        f"({with_ref['step']:.3f} -> {without['step']:.3f} s)"
    )


if __name__ == "__main__":
    main()
