"""Outcome vs process supervision on the built-in task: held-out accuracy curves, side by side.

Runs the engine in this process (no dashboard) with the same spec and seed twice: once with
outcome supervision (the verifier's one reward per output) and once with process supervision (one
rule reward per step, labelled by --labels: the built-in task's exact checker, the arithmetic checker, or
Math-Shepherd's rollouts), for each of several seeds. Prints both eval/accuracy curves, the first step
(and second) at which each reaches the target, and per supervision the median steps and seconds over the
seeds. Exit status 0 when process supervision's median reaches the target; with the exact checker, also in
no more steps than outcome's.

    .venv/bin/python -m bench.supervision_curves                      # defaults, seeds 0,1,2, target 0.90
    .venv/bin/python -m bench.supervision_curves --labels rollouts --cache-dir /tmp/grpo-cache
    .venv/bin/python -m bench.supervision_curves --seeds 0 --steps 100 --eval-every 10 --cache-dir D
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import StampedRecorder
from grpo_engine.spec.config import validate_spec
from grpo_engine.train.trainer import train


def run(spec: dict, cache_dir: Path) -> tuple[list[tuple[int, float, float]], float]:
    """[(step, seconds since start, eval/accuracy)], total seconds."""
    recorder = StampedRecorder()
    train(validate_spec(spec), recorder, cache_dir)
    curve = [
        (m["step"], recorder.stamps[m["step"]], m["eval/accuracy"]) for m in recorder.metrics if "eval/accuracy" in m
    ]
    return curve, time.time() - recorder.t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default: the spec default)")
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--target", type=float, default=0.90)
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated run seeds")
    parser.add_argument("--spec", default="{}", help="extra JSON run-spec keys for both runs")
    parser.add_argument(
        "--labels",
        default="builtin",
        choices=("builtin", "arithmetic", "rollouts"),
        help="step_labels of the process runs (rollouts: label_rollouts 4, hard)",
    )
    parser.add_argument("--cache-dir", default=None, help="built-in model cache (default: a temporary dir)")
    args = parser.parse_args()

    cache_dir = Path(args.cache_dir or tempfile.mkdtemp(prefix="grpo-bench-cache-"))
    base = {"eval_every": args.eval_every, **json.loads(args.spec)}
    if args.steps:
        base["steps_per_iteration"] = args.steps
    firsts: dict[str, list[float]] = {"outcome": [], "process": []}
    seconds: dict[str, list[float]] = {"outcome": [], "process": []}
    for seed in [int(x) for x in args.seeds.split(",")]:
        for supervision in ("outcome", "process"):
            extra = {"step_labels": args.labels} if supervision == "process" else {}
            curve, total = run({**base, "supervision": supervision, "seed": seed, **extra}, cache_dir)
            first = next(((s, t) for s, t, a in curve if a >= args.target), None)
            firsts[supervision].append(first[0] if first else math.inf)
            seconds[supervision].append(first[1] if first else math.inf)
            print(
                f"\nseed {seed}, {supervision} supervision{f' ({args.labels} labels)' if extra else ''}: {total:.1f}s"
            )
            print("  step  seconds  eval/accuracy")
            for step, t, acc in curve:
                print(f"  {step:4d} {t:8.1f} {acc:14.3f}")
            print(f"  first step at >= {args.target:.2f}: " + (f"{first[0]} ({first[1]:.1f}s)" if first else "never"))
    print(
        f"\nsteps and seconds to {args.target:.2f} (per seed; 'inf' = never), process steps labelled by {args.labels}:"
    )
    medians = {}
    for supervision, values in firsts.items():
        medians[supervision] = statistics.median(values)
        times = seconds[supervision]
        print(
            f"  {supervision:8s} steps {', '.join(str(v) for v in values)}   median {medians[supervision]};   "
            f"seconds {', '.join(f'{t:.0f}' for t in times)}   median {statistics.median(times):.0f}"
        )
    ok = medians["process"] < math.inf and (args.labels != "builtin" or medians["process"] <= medians["outcome"])
    print(
        f"process supervision reaches {args.target:.2f}"
        + (" in no more steps than outcome" if args.labels == "builtin" else "")
        + (": yes" if ok else ": NO")
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
