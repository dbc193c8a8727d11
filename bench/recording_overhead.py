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

    .venv/bin/python bench/recording_overhead.py                          # a fresh cache: builds the built-in model (~2 min)
    .venv/bin/python bench/recording_overhead.py --cache-dir /tmp/bc      # reuse a built-in model cached there
    .venv/bin/python bench/recording_overhead.py --repeats 4              # a narrower interval

Prints each run's mean step time recording and not, then over all pairs the mean step time not recording, the
difference recording makes, the overhead in percent with its 95% interval, and PASS when the overhead is at most
--max-overhead (5%). Exit status 0 on PASS.

``NoRecorder``, ``StepTimer`` and ``recorder_for`` are also what bench/vs_trl.py times the engine with.
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
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path

from grpo_engine.report.recorder import Recorder


class NoRecorder(Recorder):
    """Records nothing and never stops the run."""

    def start(self, total_steps: int) -> None:
        pass

    def log(self, message: str) -> None:
        pass

    def step(self, step: int, iteration: int, metrics: dict[str, float]) -> None:
        pass

    def groups(self, step: int, groups) -> None:
        pass

    def should_stop(self) -> bool:
        return False


class StepTimer(Recorder):
    """Forwards every event to ``inner`` and times the steps in wall-clock seconds.

    ``step_seconds[k]``: from the end of the previous ``step`` call (or of ``start``) to the end of
    this one. ``recording_seconds[method]``: time spent inside ``inner``'s method from ``start`` on.
    ``trajectory``: (reward_mean, completion_len) per step, to check that two runs did the same work.
    """

    def __init__(self, inner: Recorder):
        self.inner = inner
        self.step_seconds: list[float] = []
        self.recording_seconds = {"groups": 0.0, "step": 0.0, "should_stop": 0.0, "log": 0.0}
        self.trajectory: list[tuple[float, float]] = []
        self._last: float | None = None

    def _forward(self, method: str, *args):
        t0 = time.perf_counter()
        result = getattr(self.inner, method)(*args)
        if self._last is not None:  # from start() on
            self.recording_seconds[method] += time.perf_counter() - t0
        return result

    def start(self, total_steps: int) -> None:
        self.inner.start(total_steps)
        self._last = time.perf_counter()

    def log(self, message: str) -> None:
        self._forward("log", message)

    def groups(self, step: int, groups) -> None:
        self._forward("groups", step, groups)

    def should_stop(self) -> bool:
        return self._forward("should_stop")

    def finish(self) -> None:
        """After training: close ``inner`` (a background DBRecorder waits for its queued writes there) and
        count that time in the last step."""
        if hasattr(self.inner, "close"):
            flushed = time.perf_counter()
            self.inner.close()
            self.step_seconds[-1] += time.perf_counter() - flushed

    def step(self, step: int, iteration: int, metrics: dict[str, float]) -> None:
        self._forward("step", step, iteration, metrics)
        now = time.perf_counter()
        if step >= 1:  # step 0 (evaluation before training) is off with eval_every 0
            self.step_seconds.append(now - self._last)
            self.trajectory.append((round(metrics["reward_mean"], 6), round(metrics["completion_len"], 6)))
        self._last = now


@contextmanager
def store_recorder(spec, name: str):
    """The worker's recorder on a fresh store: a DBRecorder writing in the background to a migrated SQLite
    file in a temporary directory, where run ``name`` was created with ``spec``. Yields (recorder, store
    URL, run id); the store is removed afterwards."""
    from app import store
    from app.store.db import make_engine, session_scope, upgrade_database
    from workers.recorder import DBRecorder

    data_dir = Path(tempfile.mkdtemp(prefix="grpo-bench-store-"))
    url = f"sqlite:///{data_dir / 'grpo.sqlite'}"
    try:
        upgrade_database(url)
        with session_scope(url) as s:
            run_id = store.create_run(s, spec.to_dict(), name)
        yield DBRecorder(run_id, database_url=url, background=True), url, run_id
    finally:
        make_engine(url).dispose()
        shutil.rmtree(data_dir, ignore_errors=True)


def recorder_for(spec, record: bool, name: str):
    """``store_recorder`` when ``record``, else a NoRecorder (as a context yielding the same triple)."""
    return store_recorder(spec, name) if record else nullcontext((NoRecorder(), None, None))


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


def percent(on: float, off: float) -> float:
    return 100.0 * (on - off) / off


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
    ok = overhead <= max_overhead
    print(f"{'PASS' if ok else 'FAIL'} (overhead <= {max_overhead}%)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
