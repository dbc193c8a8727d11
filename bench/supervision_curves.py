"""Outcome vs process supervision on the built-in task: held-out accuracy curves, side by side.

Runs the engine in this process (no dashboard) twice with the same spec and seed: once with
outcome supervision (the verifier's one reward per output) and once with process supervision (the
rule step checker's one reward per step). Prints both eval/accuracy curves and the first step at
which each reaches the target.

    .venv/bin/python bench/supervision_curves.py                      # defaults, target 0.90
    .venv/bin/python bench/supervision_curves.py --steps 300 --eval-every 10 --cache-dir D
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grpo_engine.config import validate_spec  # noqa: E402
from grpo_engine.recorder import MemoryRecorder  # noqa: E402
from grpo_engine.trainer import train  # noqa: E402


def run(spec: dict, cache_dir: Path) -> tuple[list[tuple[int, float, float]], float]:
    """[(step, seconds since start, eval/accuracy)], total seconds."""
    recorder = MemoryRecorder()
    t0 = time.time()
    stamps: dict[int, float] = {}

    class Timed(MemoryRecorder):
        def step(self, step, iteration, metrics):
            stamps[step] = time.time() - t0
            recorder.step(step, iteration, metrics)

    train(validate_spec(spec), Timed(), cache_dir)
    curve = [(m["step"], stamps[m["step"]], m["eval/accuracy"]) for m in recorder.metrics if "eval/accuracy" in m]
    return curve, time.time() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default: the spec default)")
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--target", type=float, default=0.90)
    parser.add_argument("--spec", default="{}", help="extra JSON run-spec keys for both runs")
    parser.add_argument("--cache-dir", default=None, help="built-in model cache (default: a temporary dir)")
    args = parser.parse_args()

    cache_dir = Path(args.cache_dir or tempfile.mkdtemp(prefix="grpo-bench-cache-"))
    base = {"eval_every": args.eval_every, **json.loads(args.spec)}
    if args.steps:
        base["steps_per_iteration"] = args.steps
    results = {}
    for supervision in ("outcome", "process"):
        curve, total = run({**base, "supervision": supervision}, cache_dir)
        results[supervision] = curve
        first = next(((s, t) for s, t, a in curve if a >= args.target), None)
        print(f"\n{supervision} supervision: {total:.1f}s")
        print("  step  seconds  eval/accuracy")
        for step, t, acc in curve:
            print(f"  {step:4d} {t:8.1f} {acc:14.3f}")
        print(f"  first step at >= {args.target:.2f}: " + (f"{first[0]} ({first[1]:.1f}s)" if first else "never"))
    steps = {k: next((s for s, _, a in v if a >= args.target), None) for k, v in results.items()}
    print(f"\nsteps to {args.target:.2f}: outcome {steps['outcome']}, process {steps['process']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
