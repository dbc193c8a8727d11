"""Outcome vs process supervision on the built-in task: held-out accuracy curves, side by side.

Runs the engine in this process (no dashboard) with the same spec and seed twice: once with
outcome supervision (the verifier's one reward per output) and once with process supervision (one
rule reward per step, labelled by --labels: the built-in task's exact checker, the arithmetic checker, or
Math-Shepherd's rollouts), for each of several seeds. Prints both eval/accuracy curves, the first step
(and second) at which each reaches the target, and per supervision the median steps and seconds over the
seeds. Exit status 0 when process supervision's median reaches the target; with the exact checker, also in
no more steps than outcome's.

With ``--eval-samples K`` every evaluation also samples K outputs per held-out question (eval_temperature), and the
bench prints held-out Pass@k and Maj@k (k = 1, 2, 4, ... K) at each run's first and last evaluation, then their means
over the seeds per supervision: DeepSeekMath's Figure 7 reading is Maj@K rising with RL while Pass@K stays flat.
``--eval-cost`` first times one evaluation of the built-in model, greedy alone and with 8 samples per question.

    .venv/bin/python -m bench.supervision_curves                      # defaults, seeds 0,1,2, target 0.90
    .venv/bin/python -m bench.supervision_curves --labels rollouts --cache-dir /tmp/grpo-cache
    .venv/bin/python -m bench.supervision_curves --seeds 0 --steps 100 --eval-every 10 --cache-dir D
    .venv/bin/python -m bench.supervision_curves --seeds 0,1,2,3,4 --eval-samples 16 --eval-cost --cache-dir D \
        --plot docs/pass_maj_builtin.png
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
from bench.pass_maj import mean_metrics, plot_pass_maj, print_pass_maj
from grpo_engine.spec.config import validate_spec
from grpo_engine.train.trainer import train


def run(spec: dict, cache_dir: Path) -> tuple[list[tuple[int, float, float]], float, list[dict]]:
    """[(step, seconds since start, eval/accuracy)], total seconds, the evaluations' metrics."""
    recorder = StampedRecorder()
    train(validate_spec(spec), recorder, cache_dir)
    evals = [m for m in recorder.metrics if "eval/accuracy" in m]
    curve = [(m["step"], recorder.stamps[m["step"]], m["eval/accuracy"]) for m in evals]
    return curve, time.time() - recorder.t0, evals


def print_means(ends: dict[str, list[tuple[dict, dict]]], samples: int) -> None:
    """Per supervision, Pass@k and Maj@k at the first and last evaluation, means over the seeds."""
    print(f"\nmeans over the seeds of Pass@k and Maj@k (eval_samples {samples}), first -> last evaluation:")
    for supervision, pairs in ends.items():
        print(f"  {supervision}:")
        print_pass_maj(mean_metrics([p[0] for p in pairs]), mean_metrics([p[1] for p in pairs]), samples)


def eval_cost(cache_dir: Path) -> None:
    """Seconds of one held-out evaluation of the built-in model (evaluation only), greedy and with 8 samples."""
    print("one evaluation of the built-in model (steps_per_iteration 0, 200 held-out questions):")
    for samples in (0, 8):
        spec = {"steps_per_iteration": 0, "eval_every": 1, "eval_samples": samples}
        _, _, [evaluation] = run(spec, cache_dir)
        print(f"  eval_samples {samples}: {evaluation['time/eval']:.1f}s")


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
    parser.add_argument("--eval-samples", type=int, default=0, help="eval_samples K: Pass@k and Maj@k up to K")
    parser.add_argument("--eval-cost", action="store_true", help="first time one evaluation, greedy and K 8")
    parser.add_argument("--plot", help="with --eval-samples: Pass@K and Maj@K against K to this PNG")
    args = parser.parse_args()

    cache_dir = Path(args.cache_dir or tempfile.mkdtemp(prefix="grpo-bench-cache-"))
    if args.eval_cost:
        eval_cost(cache_dir)
    base = {"eval_every": args.eval_every, "eval_samples": args.eval_samples, **json.loads(args.spec)}
    if args.steps:
        base["steps_per_iteration"] = args.steps
    firsts: dict[str, list[float]] = {"outcome": [], "process": []}
    seconds: dict[str, list[float]] = {"outcome": [], "process": []}
    ends: dict[str, list[tuple[dict, dict]]] = {"outcome": [], "process": []}
    for seed in [int(x) for x in args.seeds.split(",")]:
        for supervision in ("outcome", "process"):
            extra = {"step_labels": args.labels} if supervision == "process" else {}
            curve, total, evals = run({**base, "supervision": supervision, "seed": seed, **extra}, cache_dir)
            ends[supervision].append((evals[0], evals[-1]))
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
            if args.eval_samples:
                print_pass_maj(evals[0], evals[-1], args.eval_samples)
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
    if args.eval_samples:
        print_means(ends, args.eval_samples)
        if args.plot:
            plot_pass_maj(
                {f"{name} supervision": pairs for name, pairs in ends.items()},
                args.eval_samples,
                Path(args.plot),
                "Pass@K and Maj@K before and after GRPO: built-in task (DeepSeekMath Figure 7)",
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
