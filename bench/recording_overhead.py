"""What recording a run in the store costs: the default built-in run's step time with the worker's recorder vs none.

Runs the default spec (built-in model and dataset, B = 8, G = 8, 32 new tokens) for --steps steps with
``eval_every`` 0 (evaluation is the same either way and would dominate), driving the engine's TrainingRun step by
step as ``grpo_engine.train.trainer.train`` does (what it loaded frozen for the garbage collector, gc.freeze), and
switching recording on and off in alternate blocks of --block steps within the run:

  on   the worker's recorder, workers.recorder.DBRecorder, on a fresh migrated SQLite store in a temporary data
       dir (the run row created by app.store.create_run), writing in the background as the worker does: the
       step's metrics and its 8 groups of 8 samples (texts, tokens, advantages, the per-token log-probs, ratios,
       KL and clip flags) in one transaction on its writer thread, and the cancel poll (at most once a second).
       The engine builds the groups (record_every 1). The last step of a block waits for the writer to finish.
  off  record_every 0 (the engine builds no groups) and a recorder that records nothing

Runs come in pairs: one records the odd blocks, the other the even ones, with the same seed, so that every block
is timed once recording and once not, on the same samples (checked: reward_mean and completion_len of every
step must agree), and drift of a shared machine over seconds falls on both sides of each block alike. A step's
time is wall clock around the whole step (the cancel poll, the step, the recorder's calls, and at the end of a
recording block the wait for its writes).

    .venv/bin/python -m bench.recording_overhead                          # a fresh cache: builds the built-in model (~2 min)
    .venv/bin/python -m bench.recording_overhead --cache-dir /tmp/bc      # reuse a built-in model cached there
    .venv/bin/python -m bench.recording_overhead --repeats 4              # a narrower interval

Prints each run's mean step time recording and not, then over all pairs the mean step time not recording, the
difference recording makes, the overhead in percent with its 95% interval, and PASS when the overhead is at most
--max-overhead (5%). Exit status 0 on PASS.

The recorders (``NoRecorder``, ``store_recorder``; ``StepTimer`` and ``recorder_for``, which bench/vs_trl.py times
the engine with) are bench/harness.py's.
"""

from __future__ import annotations

import argparse
import gc
import math
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from bench.harness import NoRecorder, pass_fail, percent, store_recorder


def block_is_on(step: int, block: int, phase: int) -> bool:
    """Whether ``step`` (1-based) records: blocks of ``block`` steps alternate, on first when ``phase`` is 0.

    >>> [block_is_on(step, 2, 0) for step in range(1, 7)], [block_is_on(step, 2, 1) for step in range(1, 7)]
    ([True, True, False, False, True, True], [False, False, True, True, False, False])
    """
    return ((step - 1) // block + phase) % 2 == 0


def run_blocks(spec, cache_dir: Path, block: int, phase: int) -> dict:
    """One run of ``spec`` that records in alternate blocks of ``block`` steps (``block_is_on``), driven step by
    step as ``grpo_engine.train.trainer.train`` drives it. On a recording step the run has its spec and the worker's
    DBRecorder (``store_recorder``): the engine builds the step's groups, the recorder queues them with the metrics
    for its writer thread, and the cancel poll runs; the last step of a block also waits for the writer to finish
    (``flush``), so no write of a block spills into the next. Off a recording step the spec says ``record_every``
    0 and a NoRecorder takes the events: nothing is built or written.

    Returns {"seconds": wall time of each step (from 1), "on": whether it recorded, "trajectory": (reward_mean,
    completion_len) of each step, "recorded": the steps the store holds metrics for}."""
    from app import store
    from app.store.db import session_scope
    from grpo_engine.train.loading import load_learner
    from grpo_engine.train.trainer import TrainingRun

    off_spec, nothing = replace(spec, record_every=0), NoRecorder()
    with store_recorder(spec, "recording-overhead") as (db, url, run_id):
        run = TrainingRun(spec, nothing, None, *load_learner(spec, nothing, cache_dir, None))
        gc.freeze()  # as train does once the run is loaded
        run.resume()
        run.before_training()
        run.training_phase()
        db.start(spec.total_steps)
        seconds, on, trajectory = [], [], []
        for step in range(1, spec.total_steps + 1):
            recording = block_is_on(step, block, phase)
            run.spec, run.recorder = (spec, db) if recording else (off_spec, nothing)
            t0 = time.perf_counter()
            assert not run.recorder.should_stop()
            run.next_step(1)
            if recording and not block_is_on(step + 1, block, phase):
                db.flush()  # the end of a recording block: its writes count in it
            seconds.append(time.perf_counter() - t0)
            on.append(recording)
            trajectory.append((round(run.metrics["reward_mean"], 6), round(run.metrics["completion_len"], 6)))
        db.close()
        gc.unfreeze()
        with session_scope(url) as s:
            recorded = [m["step"] for m in store.get_metrics(s, run_id)]
            assert all(len(store.list_groups(s, run_id, step)) == spec.batch_size for step in recorded)
    return {"seconds": seconds, "on": on, "trajectory": trajectory, "recorded": recorded}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="steps per run (steps_per_iteration)")
    parser.add_argument("--block", type=int, default=5, help="steps per block; recording blocks alternate with others")
    parser.add_argument(
        "--repeats", type=int, default=2, help="pairs of runs (one recording the odd blocks, one the even)"
    )
    parser.add_argument(
        "--cache-dir", help="built-in model cache (default: a temporary dir; the model is built there first)"
    )
    parser.add_argument(
        "--max-overhead", type=float, default=5.0, help="PASS when the overhead is at most this, in percent"
    )
    args = parser.parse_args()

    from grpo_engine.model.model import builtin_model_dir
    from grpo_engine.spec.config import validate_spec

    cache_dir = Path(args.cache_dir or tempfile.mkdtemp(prefix="grpo-rec-overhead-cache-")).resolve()
    spec = validate_spec({"steps_per_iteration": args.steps, "eval_every": 0})
    print(
        f"spec: batch {spec.batch_size} x group {spec.group_size}, max_new_tokens {spec.max_new_tokens}, "
        f"{spec.total_steps} steps in blocks of {args.block}, seed {spec.seed}, eval_every 0; model cache {cache_dir}",
        flush=True,
    )
    try:
        t0 = time.perf_counter()
        builtin_model_dir(cache_dir, log=lambda message: print(f"  {message}", flush=True))
        print(f"built-in model ready in {time.perf_counter() - t0:.1f}s", flush=True)
        pairs = []
        for repeat in range(1, args.repeats + 1):
            pair = []
            for phase in (0, 1):
                result = run_blocks(spec, cache_dir, args.block, phase)
                assert result["recorded"] == [k + 1 for k, on in enumerate(result["on"]) if on], result["recorded"]
                pair.append(result)
                on = [t for t, r in zip(result["seconds"], result["on"], strict=True) if r]
                off = [t for t, r in zip(result["seconds"], result["on"], strict=True) if not r]
                print(
                    f"repeat {repeat} run {phase + 1}: recording {statistics.fmean(on):.4f} s/step, "
                    f"not recording {statistics.fmean(off):.4f} s/step ({percent(statistics.fmean(on), statistics.fmean(off)):+.1f}%)",
                    flush=True,
                )
            pairs.append(pair)
    finally:
        if args.cache_dir is None:
            shutil.rmtree(cache_dir, ignore_errors=True)
    return report(pairs, args.block, args.max_overhead)


def report(pairs: list[list[dict]], block: int, max_overhead: float) -> int:
    """The overhead over every pair of runs, with its 95% interval; prints the verdict, returns the exit status.

    In a pair, each block of steps recorded in one run and not in the other, on the same samples (recording does
    not change what is sampled, which is checked). A block's difference is its mean step time recording minus not
    recording; the overhead is the mean difference over the mean time not recording, its interval 2 standard
    errors of the mean difference over the blocks. The first block is left out (it holds the first step, which
    sets up caches)."""
    reference = pairs[0][0]["trajectory"]
    same = all(r["trajectory"] == reference for pair in pairs for r in pair)
    print(f"\nevery run sampled the same trajectory: {'yes' if same else 'NO (the comparison is less exact)'}")
    differences, off_means = [], []
    for pair in pairs:
        steps = len(pair[0]["seconds"])
        for start in range(block, steps, block):  # the first block left out
            span = range(start, min(start + block, steps))
            by_run = [statistics.fmean(r["seconds"][k] for k in span) for r in pair]
            on_run = 0 if pair[0]["on"][start] else 1
            differences.append(by_run[on_run] - by_run[1 - on_run])
            off_means.append(by_run[1 - on_run])
    off = statistics.fmean(off_means)
    mean_difference = statistics.fmean(differences)
    error = 2 * statistics.stdev(differences) / math.sqrt(len(differences)) if len(differences) > 1 else float("nan")
    overhead = 100 * mean_difference / off
    print(f"{len(differences)} blocks of {block} steps, each recording in one run and not in the other")
    print(
        f"not recording {off:.4f} s/step; recording {off + mean_difference:.4f} s/step "
        f"({1000 * mean_difference:+.1f} ms/step)"
    )
    print(
        f"overhead of recording: {overhead:+.2f}% (95% interval {overhead - 100 * error / off:+.2f}% to "
        f"{overhead + 100 * error / off:+.2f}%)"
    )
    return pass_fail(overhead <= max_overhead, f"(overhead <= {max_overhead}%)")


if __name__ == "__main__":
    sys.exit(main())
