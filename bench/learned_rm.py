"""Learned reward models on the built-in task: an ORM run with the iterative refresh, and a PRM run.

Runs the engine directly (grpo_engine.train.trainer.train with an in-memory recorder; no dashboard):

  (a) outcome supervision, reward: model (a learned ORM), 3 iterations of 20 steps, other settings
      default. Prints each RM refresh (held-out accuracy on fresh policy samples before -> after), the
      policy's held-out eval/accuracy curve and its final value. The iterations are short on purpose:
      a refresh can only help when the policy moved during the iteration before it; once the policy
      stops moving, the accuracy before a refresh is already at its ceiling and a refresh changes it
      by about the noise of the held-out sample (rm_samples / 4 = 512 outputs).
  (b) process supervision, reward: model (a learned PRM). Prints that it completed, the PRM's
      training, and one group's per-step rewards.

    .venv/bin/python -m bench.learned_rm --cache-dir /tmp/c11        # reuse a cached built-in model
    .venv/bin/python -m bench.learned_rm --steps-per-iteration 40 --prm-steps 30
    .venv/bin/python -m bench.learned_rm --only orm --seeds 0,1,2

Exit status 0 when every refresh raised the RM's held-out accuracy and the ORM run's final
eval/accuracy is at least 0.85, else 1.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from grpo_engine.report.recorder import MemoryRecorder
from grpo_engine.spec.config import validate_spec
from grpo_engine.train.trainer import train

TARGET_ACCURACY = 0.85


class PrintingRecorder(MemoryRecorder):
    """Keeps everything, and prints the engine's log lines with the time since the start."""

    def __init__(self, t0: float):
        super().__init__()
        self.t0 = t0

    def log(self, message: str) -> None:
        super().log(message)
        print(f"  [{time.time() - self.t0:6.1f}s] {message}", flush=True)


def run(spec: dict, cache_dir: Path) -> tuple[dict, PrintingRecorder, float]:
    t0 = time.time()
    print(f"spec: {spec}", flush=True)
    recorder = PrintingRecorder(t0)
    result = train(validate_spec(spec), recorder, cache_dir)
    return result, recorder, time.time() - t0


def orm_run(steps_per_iteration: int, seed: int, cache_dir: Path) -> bool:
    print("(a) ORM: outcome supervision with a learned outcome reward model, 3 iterations")
    result, rec, seconds = run(
        {"reward": "model", "iterations": 3, "steps_per_iteration": steps_per_iteration, "seed": seed}, cache_dir
    )
    print(f"status: {result.status} after {result.step} steps in {seconds:.0f}s")
    start = rec.metrics[0]
    print(f"RM initial training: loss {start['rm/loss']:.3f}, held-out accuracy {start['rm/accuracy_after']:.3f}")
    refreshes = [m for m in rec.metrics if "rm/accuracy_before" in m]
    print(
        f"{'iteration':>9} {'step':>5} {'rm/loss':>8} {'rm/accuracy_before':>19} {'rm/accuracy_after':>18} {'change':>7}"
    )
    for m in refreshes:
        change = m["rm/accuracy_after"] - m["rm/accuracy_before"]
        print(
            f"{m['iteration']:9d} {m['step']:5d} {m['rm/loss']:8.3f} {m['rm/accuracy_before']:19.3f} "
            f"{m['rm/accuracy_after']:18.3f} {change:+7.3f}"
        )
    print(f"{'step':>5} {'eval/accuracy':>14} {'correct_frac':>13} {'reward_mean (ORM)':>18}")
    for m in rec.metrics:
        if "eval/accuracy" in m:
            print(
                f"{m['step']:5d} {m['eval/accuracy']:14.3f} {m.get('correct_frac', float('nan')):13.3f} "
                f"{m.get('reward_mean', float('nan')):18.3f}"
            )
    accs = [m["eval/accuracy"] for m in rec.metrics if "eval/accuracy" in m]
    improved = sum(m["rm/accuracy_after"] > m["rm/accuracy_before"] for m in refreshes)
    print(f"refreshes that raised the RM's held-out accuracy: {improved}/{len(refreshes)}")
    print(
        f"eval/accuracy: first {accs[0]:.3f}, final {accs[-1]:.3f}, best {max(accs):.3f} (target >= {TARGET_ACCURACY})"
    )
    return result.status == "completed" and improved == len(refreshes) == 3 and accs[-1] >= TARGET_ACCURACY


def prm_run(steps: int, seed: int, cache_dir: Path) -> bool:
    print("(b) PRM: process supervision with a learned process reward model")
    result, rec, seconds = run(
        {"reward": "model", "supervision": "process", "steps_per_iteration": steps, "eval_every": steps, "seed": seed},
        cache_dir,
    )
    print(f"status: {result.status} after {result.step} steps in {seconds:.0f}s")
    for m in rec.metrics:
        if "rm/accuracy_after" in m:
            before = f"{m['rm/accuracy_before']:.3f} -> " if "rm/accuracy_before" in m else ""
            print(
                f"step {m['step']}: PRM loss {m['rm/loss']:.3f}, held-out step accuracy {before}"
                f"{m['rm/accuracy_after']:.3f}"
            )
    accs = [(m["step"], m["eval/accuracy"]) for m in rec.metrics if "eval/accuracy" in m]
    print("eval/accuracy: " + ", ".join(f"step {s} {a:.3f}" for s, a in accs))
    last = max(rec.group_log)
    group = rec.group_log[last][0]
    print(f"a group at step {last}: prompt {group.prompt!r}, reference {group.reference}")
    for s in group.samples:
        steps_text = [t.strip() for t in s.completion.split("\n") if t.strip()]
        scored = ", ".join(f"{t!r}: {r:.2f}" for t, r in zip(steps_text, s.step_rewards, strict=True))
        print(
            f"  correct={s.reward_components['correct']:.0f} reward {s.reward:.3f} "
            f"step ends {s.step_end_indices} step rewards [{scored}]"
        )
    return result.status == "completed"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", help="built-in model cache (default: a temporary directory; builds the model)")
    parser.add_argument(
        "--steps-per-iteration",
        type=int,
        default=20,
        help="M of the ORM run (3 iterations): short enough that the policy moves within each one",
    )
    parser.add_argument("--prm-steps", type=int, default=20, help="steps of the PRM run (1 iteration)")
    parser.add_argument("--only", choices=("orm", "prm"), help="run only one of the two")
    parser.add_argument("--seeds", default="0", help="comma-separated run seeds (each runs the chosen runs)")
    args = parser.parse_args()
    cache_dir = Path(args.cache_dir or tempfile.mkdtemp(prefix="grpo-bench-cache-"))
    ok = True
    for seed in [int(x) for x in args.seeds.split(",")]:
        print(f"=== seed {seed}")
        if args.only in (None, "orm"):
            ok &= orm_run(args.steps_per_iteration, seed, cache_dir)
        if args.only in (None, "prm"):
            ok &= prm_run(args.prm_steps, seed, cache_dir)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
