"""GRPO's variants side by side on the built-in task: steps and seconds to a held-out accuracy, and the output length.

Trains each variant for each seed with the engine (grpo_engine.train.trainer.train, no dashboard), every run in its own
process so that its peak memory is its own:

  grpo      the paper's GRPO (every default)
  dr_grpo   loss_type dr_grpo, scale_rewards none (Dr. GRPO)
  dapo      loss_type dapo, skip_zero_spread, clip_eps_high 0.28 (DAPO's token-level loss, dynamic sampling and
            clip-higher)
  gspo      ratio_level sequence (GSPO)
  no_kl     the paper's GRPO with kl_coef 0: no reference model is loaded and none of its forward passes run

Prints one table: per variant the steps and seconds to --target held-out accuracy for each seed and their medians,
the mean completion length at the last step, the median seconds of a step (time/step) and the peak resident memory
of the run's process; then what kl_coef 0 saves against grpo.

    .venv/bin/python -m bench.variants --cache-dir /tmp/grpo-cache
    .venv/bin/python -m bench.variants --variants grpo,dapo --seeds 0 --steps 60 --cache-dir /tmp/grpo-cache

Exit status 0 when every variant reaches the target on the median seed, else 1.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path

from bench.harness import StampedRecorder, json_child, peak_rss

VARIANTS = {
    "grpo": {},
    "dr_grpo": {"loss_type": "dr_grpo", "scale_rewards": "none"},
    "dapo": {"loss_type": "dapo", "skip_zero_spread": True, "clip_eps_high": 0.28},
    "gspo": {"ratio_level": "sequence"},
    "no_kl": {"kl_coef": 0.0},
}


def one_run(spec: dict, cache_dir: Path, target: float) -> dict:
    """Train one spec here; the first step (and second) at which eval/accuracy reaches ``target``, the last step's
    completion length, the median step time and this process's peak memory."""
    from grpo_engine.spec.config import validate_spec
    from grpo_engine.train.trainer import train

    recorder = StampedRecorder()
    train(validate_spec(spec), recorder, cache_dir, device="cpu")
    first = next(
        ((m["step"], recorder.stamps[m["step"]]) for m in recorder.metrics if m.get("eval/accuracy", -1.0) >= target),
        (math.inf, math.inf),
    )
    steps = [m for m in recorder.metrics if m["step"] > 0]
    return {
        "steps": first[0],
        "seconds": first[1],
        "completion_len": steps[-1]["completion_len"],
        "step_time": statistics.median(m["time/step"] for m in steps),
        "peak_mb": peak_rss() / 2**20,
        "final": [m["eval/accuracy"] for m in recorder.metrics if "eval/accuracy" in m][-1],
    }


def in_subprocess(spec: dict, cache_dir: Path, target: float) -> dict:
    """``one_run`` in a fresh Python process (its peak memory is this run's alone)."""
    return json_child(
        "bench.variants", "--one", json.dumps(spec), "--cache-dir", str(cache_dir), "--target", str(target)
    )


def fmt(values: list[float], digits: int = 0) -> str:
    """Values joined by commas, 'inf' for never."""
    return ", ".join("inf" if math.isinf(v) else f"{v:.{digits}f}" for v in values)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=200, help="steps per run")
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--target", type=float, default=0.90)
    parser.add_argument("--cache-dir", default=None, help="built-in model cache (default: a temporary dir)")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a run spec: train it, print one JSON line
    args = parser.parse_args()
    cache_dir = Path(args.cache_dir or tempfile.mkdtemp(prefix="grpo-bench-cache-"))
    if args.one:
        print(json.dumps(one_run(json.loads(args.one), cache_dir, args.target)))
        return 0

    base = {"steps_per_iteration": args.steps, "eval_every": args.eval_every, "checkpoint_every": 0}
    results: dict[str, list[dict]] = {}
    for seed in [int(s) for s in args.seeds.split(",")]:
        for name in args.variants.split(","):
            r = in_subprocess({**base, **VARIANTS[name], "seed": seed}, cache_dir, args.target)
            results.setdefault(name, []).append(r)
            print(
                f"{name:8s} seed {seed}: steps to {args.target:.2f} {fmt([r['steps']])}, {fmt([r['seconds']])}s; "
                f"final accuracy {r['final']:.3f}, completion length {r['completion_len']:.1f}",
                flush=True,
            )

    print(
        f"\nsteps and seconds to {args.target:.2f} held-out accuracy (seeds {args.seeds}; inf = never in "
        f"{args.steps} steps)"
    )
    print(
        f"{'variant':8s}  {'steps':>14s} {'median':>6s}  {'seconds':>14s} {'median':>6s}  {'length':>6s}  "
        f"{'s/step':>6s}  {'peak MB':>7s}"
    )
    ok = True
    for name, runs in results.items():
        steps, seconds = [r["steps"] for r in runs], [r["seconds"] for r in runs]
        ok &= not math.isinf(statistics.median(steps))
        print(
            f"{name:8s}  {fmt(steps):>14s} {statistics.median(steps):6.0f}  {fmt(seconds):>14s} "
            f"{statistics.median(seconds):6.0f}  {statistics.mean(r['completion_len'] for r in runs):6.1f}  "
            f"{statistics.median(r['step_time'] for r in runs):6.3f}  "
            f"{statistics.median(r['peak_mb'] for r in runs):7.0f}"
        )
    if "grpo" in results and "no_kl" in results:

        def med(name, key):
            return statistics.median(r[key] for r in results[name])

        print(
            f"\nkl_coef 0 against grpo: step time {med('grpo', 'step_time'):.3f}s -> {med('no_kl', 'step_time'):.3f}s "
            f"({1 - med('no_kl', 'step_time') / med('grpo', 'step_time'):+.0%} saved), peak memory "
            f"{med('grpo', 'peak_mb'):.0f} MB -> {med('no_kl', 'peak_mb'):.0f} MB "
            f"({med('grpo', 'peak_mb') - med('no_kl', 'peak_mb'):.0f} MB saved)"
        )
    print("every variant reaches the target on the median seed: " + ("yes" if ok else "NO"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
