"""The check to run on a new GPU machine: the gpu tests, then this engine against TRL's GRPOTrainer.

The tests are short real runs of every kind; the comparison trains a ~0.5B Qwen2 in bf16 autocast.

    .venv/bin/python -m bench.gpu_check                          # everything
    .venv/bin/python -m bench.gpu_check --cache-dir D            # keep the tests' built-in model in D
    .venv/bin/python -m bench.gpu_check --skip-tests --steps 10  # only the engine and TRL, shorter
    .venv/bin/python -m bench.gpu_check --skip-trl               # the tests and the engine alone

In order:

1. torch's version, the CUDA version it was built for, and each GPU it sees (name, memory, compute
   capability, bf16 support). Without a CUDA GPU it says so and exits with status 2 at once.
2. ``python -m pytest -m gpu -ra`` with this interpreter, from the repository root (skipped with
   --skip-tests): short real runs (outcome and process supervision, LoRA, bf16, a learned reward model,
   gradient checkpointing, micro-batches, 8-bit AdamW) on the built-in model and on a tiny Qwen2 chat model, the
   engine picking the GPU itself as a worker does; on a machine with 2 GPUs or more, a sharded 2-process run
   (sharding fsdp over NCCL, bf16 mixed precision; skipped, saying so, with one GPU). Its output is shown as it runs, then its summary line.
3. bench/vs_trl.py's qwen05b model (Qwen2.5-0.5B's shape, ~494M parameters, random weights) built
   locally with the built-in tokenizer plus ChatML's tokens and chat template, trained --steps (20) steps
   with G 8, B 16, 256 new tokens, bf16 autocast with fp32 weights and optimizer state, through this engine
   and through TRL's GRPOTrainer, each in a fresh process, with the same settings, chat-formatted prompts,
   questions and verifier (bench/vs_trl_trials.py's trials; vs_trl.py's docstring lists what is the same on
   both sides). TRL is the optional extra ``pip install -e '.[bench]'``: without it (or with --skip-trl) only
   the engine runs.
   Printed for each: completions/s, completion tokens/s (EOS included), seconds per step, tokens per
   completion, and GPU memory (torch.cuda.max_memory_allocated from the end of the set-up, after the bytes
   allocated at that point); then the engine / TRL ratios, and the engine's phases and achieved FLOP/s. The
   first --warmup (2) steps of each are left out of the rates. B x G = 128 sequences of up to 256 new tokens
   over a 151,936-token vocabulary make logits of ~5e9 values: expect tens of GB; on a smaller GPU lower
   --batch-size or --max-new-tokens.

Last, one PASS / FAIL / SKIP line per part. Exit status 0 when the gpu tests pass and each trainer run
completes; 1 when the tests fail or a trainer fails (the end of its output is printed); 2 without a CUDA GPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import vs_trl, vs_trl_models, vs_trl_trials  # torch is imported inside the functions of these three
from bench.harness import ROOT

GB = 1e9
NO_CUDA = 2  # exit status without a CUDA GPU


def device_report() -> bool:
    """Print torch, its CUDA and the GPUs it sees; return whether there is a CUDA GPU."""
    import torch

    print(
        f"torch {torch.__version__}, built for CUDA {torch.version.cuda or 'none (a CPU build)'}"
        + (f", cuDNN {torch.backends.cudnn.version()}" if torch.backends.cudnn.is_available() else "")
    )
    if not torch.cuda.is_available():
        print(
            "no CUDA GPU: torch.cuda.is_available() is False. This check needs one: on a GPU machine install "
            "the torch build for your CUDA version (a CPU build says 'none' above) and check that nvidia-smi "
            "sees the GPU and CUDA_VISIBLE_DEVICES does not hide it."
        )
        return False
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        print(f"GPU {i}: {p.name}, {p.total_memory / GB:.1f} GB, compute capability {p.major}.{p.minor}")
    print(f"bf16 supported: {torch.cuda.is_bf16_supported()}; the benchmark runs on GPU 0")
    return True


def run_gpu_tests(cache_dir: str | None) -> tuple[bool, str]:
    """pytest -m gpu -ra in a subprocess, its output shown as it comes; (passed, its summary line)."""
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "-ra"]
    print(f"\n== gpu tests: {' '.join(command[2:])} (in {ROOT}) ==", flush=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}  # everything is local
    if cache_dir:
        env["GRPO_TEST_CACHE_DIR"] = cache_dir
    summary = ""
    with subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:
        for line in proc.stdout:
            print(line, end="", flush=True)
            if re.search(r"\d+ (passed|failed|skipped|errors?|deselected)\b.* in [\d.]+s", line):  # pytest's last line
                summary = line.strip().strip("=").strip()
    summary = summary or f"pytest exited with status {proc.returncode} and no summary"
    return proc.returncode == 0 and "passed" in summary, summary


def run_trainers(args, with_trl: bool) -> list[tuple[str, str, str]]:
    """Engine (and TRL) on qwen05b; print their table; return (PASS|FAIL, part, detail) lines."""
    work_dir = Path(tempfile.mkdtemp(prefix="grpo-gpu-check-"))
    n = args.batch_size * args.group_size
    settings = dict(
        batch_size=args.batch_size,
        group_size=args.group_size,
        max_new_tokens=args.max_new_tokens,
        beta=0.04,
        epsilon=0.2,
        temperature=1.0,
        top_p=1.0,
        learning_rate=args.learning_rate,
        seed=args.seed,
        cache_dir=str(work_dir / "cache"),
    )
    print(
        f"\n== this engine vs TRL: {vs_trl.GPU_CONFIG}, B {args.batch_size} x G {args.group_size}, "
        f"{args.max_new_tokens} new tokens, {args.steps} steps (the first {args.warmup} left out) ==",
        flush=True,
    )
    results, lines = {}, []
    try:
        t0 = time.perf_counter()
        model_dir, params = vs_trl_models.prepare_model(
            vs_trl.GPU_CONFIG, work_dir / "cache", work_dir, args.seed, chat=True
        )
        print(
            f"{vs_trl.GPU_CONFIG}: {params:,} parameters, ChatML template, written to {model_dir} "
            f"in {time.perf_counter() - t0:.0f}s",
            flush=True,
        )
        for variant, name in [("engine off", "engine"), ("trl", "TRL")][: 2 if with_trl else 1]:
            trial = {
                **settings,
                "config": vs_trl.GPU_CONFIG,
                "variant": variant,
                "model_dir": model_dir,
                "steps": args.steps,
                "record": False,
                "device": "cuda",
                "chat": True,
            }
            print(f"{name}: training...", flush=True)
            t0 = time.perf_counter()
            try:
                results[name] = vs_trl_trials.run_child(trial)
            except SystemExit as failure:  # run_child's message: the trial's exit status and output tail
                print(f"{name} FAILED:\n{failure}", flush=True)
                lines.append(("FAIL", name, "the run failed (its output is above)"))
                continue
            p = vs_trl.Pooled([results[name]], args.warmup, n)
            print(
                f"{name}: {p.completions_per_s():.1f} completions/s, {p.tokens_per_s():.1f} tokens/s "
                f"({time.perf_counter() - t0:.0f}s with set-up)",
                flush=True,
            )
            lines.append(("PASS", name, f"{args.steps} steps completed"))
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    if not results:
        return lines

    pooled = {name: vs_trl.Pooled([r], args.warmup, n) for name, r in results.items()}
    gpu = next(iter(results.values()))["device_name"]
    print(
        f"\n{vs_trl.GPU_CONFIG}: {params:,} parameters, bf16 autocast on {gpu}; {args.steps - args.warmup} "
        f"measured steps of B x G = {n} completions"
    )
    print(
        f"{'trainer':<8} {'compl/s':>8} {'tokens/s':>9} {'s/step':>7} {'tok/compl':>9}   "
        f"GPU memory: at start -> peak (max allocated)"
    )
    for name, p in pooled.items():
        before, peak = p.memory()
        print(
            f"{name:<8} {p.completions_per_s():8.1f} {p.tokens_per_s():9.1f} {p.mean('step_seconds'):7.2f} "
            f"{p.mean('completion_tokens') / n:9.1f}   {before / GB:6.2f} GB -> {peak / GB:6.2f} GB "
            f"(+{(peak - before) / GB:.2f})"
        )
    if len(pooled) == 2:
        engine, trl = pooled["engine"], pooled["TRL"]
        print(
            f"engine / TRL: completions/s {engine.completions_per_s() / trl.completions_per_s():.2f}x, "
            f"tokens/s {engine.tokens_per_s() / trl.tokens_per_s():.2f}x, "
            f"peak GPU memory {engine.memory()[1] / trl.memory()[1]:.2f}x"
        )
    if "engine" in pooled:
        vs_trl.report_engine_work(pooled["engine"], params)
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-tests", action="store_true", help="do not run pytest -m gpu")
    parser.add_argument("--skip-trl", action="store_true", help="run the engine only, not TRL's GRPOTrainer")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps of each trainer")
    parser.add_argument("--warmup", type=int, default=2, help="first steps left out of the rates")
    parser.add_argument("--batch-size", type=int, default=16, help="B: questions per step")
    parser.add_argument("--group-size", type=int, default=8, help="G: completions per question")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--learning-rate", type=float, default=1e-6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--cache-dir",
        help="the gpu tests' built-in model cache (GRPO_TEST_CACHE_DIR; default: "
        "a temporary dir, the model built there first)",
    )
    args = parser.parse_args()
    if not 0 <= args.warmup < args.steps:
        parser.error("--warmup must be less than --steps")

    if not device_report():
        return NO_CUDA
    lines = []
    if args.skip_tests:
        lines.append(("SKIP", "gpu tests", "--skip-tests"))
    else:
        passed, summary = run_gpu_tests(str(Path(args.cache_dir).resolve()) if args.cache_dir else None)
        lines.append(("PASS" if passed else "FAIL", "gpu tests", summary))

    with_trl = not args.skip_trl and importlib.util.find_spec("trl") is not None
    if not args.skip_trl and not with_trl:
        print("\ntrl is not installed (pip install -e '.[bench]'): the engine runs alone")
    lines += run_trainers(args, with_trl)
    if not with_trl:
        lines.append(("SKIP", "TRL", "--skip-trl" if args.skip_trl else "trl is not installed"))

    print("\n== summary ==")
    for verdict, part, detail in lines:
        print(f"{verdict} {part}: {detail}")
    return 1 if any(verdict == "FAIL" for verdict, _, _ in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
