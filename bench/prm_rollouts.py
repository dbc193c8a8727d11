"""A learned PRM trained only on rollout labels, on the built-in task: does it learn the exact checker's labels?

Runs the engine in this process (grpo_engine.train.trainer.train with an in-memory recorder; no dashboard): process
supervision with a learned PRM (reward: model) whose training samples are labelled by Math-Shepherd's rollouts
(step_labels: rollouts, N = 4, hard estimation), never by the built-in task's exact checker, and with no rm_data;
3 iterations, the PRM refreshed on the policy's own samples after each but the last.

Around each of the PRM's trainings, this script measures what the run itself cannot: the PRM's step accuracy on
fresh held-out samples of the current policy labelled by the exact checker, before and after the training. It
prints those, the run's own rm/* metrics (against rollout labels), and the policy's held-out accuracy curve.

    .venv/bin/python -m bench.prm_rollouts --cache-dir /tmp/grpo-cache
    .venv/bin/python -m bench.prm_rollouts --steps-per-iteration 40 --rm-samples 1024 --seed 0

Exit status 0 when each refresh raises the PRM's exact-checker accuracy (after it, above before it, on the same
samples) and the policy's last held-out accuracy is at least --target (0.90), else 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import tempfile
import time
from pathlib import Path

from grpo_engine.report.recorder import MemoryRecorder
from grpo_engine.rm.reward_model import accuracy
from grpo_engine.rm.rm_training import sample_labelled
from grpo_engine.spec.config import validate_spec
from grpo_engine.train import trainer

EXACT_SAMPLES = 512  # held-out outputs labelled by the exact checker at each measurement


def measured_training(exact: list[dict]):
    """trainer's train_reward_model, wrapped: the PRM's step accuracy against the exact checker on fresh held-out
    samples of the current policy, before and after each training, is appended to ``exact``."""
    inner = trainer.train_reward_model

    def train_reward_model(rm, state, sampler, *, train_set, heldout, spec, **kwargs):
        exact_spec = dataclasses.replace(spec, step_labels="builtin")  # the built-in task's exact checker
        questions = random.Random(len(exact)).choices(heldout, k=EXACT_SAMPLES)
        held = sample_labelled(sampler, questions, exact_spec, "prm")
        before = accuracy(rm, held) if state.history else None
        t0 = time.time()
        metrics = inner(rm, state, sampler, train_set=train_set, heldout=heldout, spec=spec, **kwargs)
        exact.append(
            {
                "before": before,
                "after": accuracy(rm, held),
                "seconds": time.time() - t0,
                "rollout_before": metrics.get("rm/accuracy_before"),
                "rollout_after": metrics["rm/accuracy_after"],
                "examples": metrics["rm/train_examples"],
            }
        )
        return metrics

    return train_reward_model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--steps-per-iteration", type=int, default=40)
    parser.add_argument("--rm-samples", type=int, default=1024)
    parser.add_argument("--rollouts", type=int, default=4)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", type=float, default=0.90)
    parser.add_argument("--cache-dir", default=None, help="built-in model cache (default: a temporary dir)")
    args = parser.parse_args()
    cache_dir = Path(args.cache_dir or tempfile.mkdtemp(prefix="grpo-bench-cache-"))

    spec = validate_spec(
        {
            "supervision": "process",
            "reward": "model",
            "step_labels": "rollouts",
            "label_rollouts": args.rollouts,
            "label_estimate": "hard",
            "iterations": args.iterations,
            "steps_per_iteration": args.steps_per_iteration,
            "rm_samples": args.rm_samples,
            "eval_every": args.eval_every,
            "seed": args.seed,
        }
    )
    exact: list[dict] = []
    trainer.train_reward_model = measured_training(exact)
    recorder = MemoryRecorder()
    t0 = time.time()
    result = trainer.train(spec, recorder, cache_dir, device="cpu")
    total = time.time() - t0
    print(
        f"PRM on rollout labels (N = {args.rollouts}, hard), {args.iterations} iterations x "
        f"{args.steps_per_iteration} steps, rm_samples {args.rm_samples}, seed {args.seed}: {result.status} "
        f"in {total:.0f}s"
    )
    print("\n  training      exact checker: before -> after   rollout labels: before -> after   examples  seconds")
    for k, e in enumerate(exact):
        name = "initial" if k == 0 else f"refresh {k}"
        before = "   -  " if e["before"] is None else f"{e['before']:.3f}"
        rollout_before = "   -  " if e["rollout_before"] is None else f"{e['rollout_before']:.3f}"
        print(
            f"  {name:12s}  {before:>21s} -> {e['after']:.3f}   {rollout_before:>22s} -> {e['rollout_after']:.3f}"
            f"   {e['examples']:8.0f}  {e['seconds']:7.1f}"
        )
    curve = [(m["step"], m["eval/accuracy"]) for m in recorder.metrics if "eval/accuracy" in m]
    print("\n  step  eval/accuracy")
    for step, acc in curve:
        print(f"  {step:4d} {acc:14.3f}")
    afters = [e["after"] for e in exact]
    rising = len(exact) > 1 and all(e["after"] > e["before"] for e in exact[1:])
    final = curve[-1][1] if curve else 0.0
    print(
        f"\neach refresh raises the PRM's exact-checker accuracy: {'yes' if rising else 'NO'} "
        f"(after each training: {', '.join(f'{a:.3f}' for a in afters)})"
    )
    print(
        f"the policy's held-out accuracy reaches {args.target:.2f}: {'yes' if final >= args.target else 'NO'} "
        f"(last {final:.3f}, best {max((a for _, a in curve), default=0.0):.3f})"
    )
    return 0 if rising and final >= args.target else 1


if __name__ == "__main__":
    sys.exit(main())
