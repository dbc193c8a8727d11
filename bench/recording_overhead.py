"""What recording a run in the store costs: the default built-in run with the real DBRecorder vs none.

Runs ``grpo_engine.trainer.train`` on the default spec (built-in model and dataset, B = 8, G = 8,
32 new tokens), with ``steps_per_iteration`` = --steps and ``eval_every`` 0 (evaluation is the
same in both and would dominate), in two configurations, alternated in this one process
(off, on, off, on, ... --repeats times each) so that drift of a shared machine falls on both:

  off  a recorder that records nothing (every method a no-op, should_stop False), and record_every 0: the
       engine builds no groups either (no texts, no per-token arrays taken off the device)
  on   workers.recorder.DBRecorder, the worker's recorder, on a fresh migrated SQLite store in a
       temporary data dir, with the run row created by app.store.create_run: one transaction per
       event (metrics, the step's 8 groups of 8 samples with their tokens, advantages and the per-token
       log-probs, ratios, KL and clip flags as typed arrays, logs),
       written as the worker writes them, by a background writer thread (the time to write what is
       still queued at the end counts in the last step), and the cancel poll (at most once a second)

The engine's own ``time/step`` metric ends before the recorder is called, so it cannot show the
cost. Each configuration is wrapped in a recorder that forwards every event to it and notes the
wall time at the end of every ``step`` call (and of ``start``): a step's wall time is the time
between two of those, which holds the step's training, its ``groups`` and ``step`` recording and
the ``should_stop`` poll. It also adds up the time spent inside the forwarded calls, per method
(the recording itself). Same seed, same spec: both configurations sample the same completions, which
is checked (reward_mean and completion_len of every step must agree).

    .venv/bin/python bench/recording_overhead.py                          # a fresh cache: builds the built-in model (~2 min)
    .venv/bin/python bench/recording_overhead.py --cache-dir /tmp/bc      # reuse a built-in model cached there
    .venv/bin/python bench/recording_overhead.py --steps 10 --repeats 1   # a quick look

Prints, per configuration, the mean and median seconds per step (all repeats' steps pooled) and the
mean per repeat, the overhead of ``on`` over ``off`` in percent (on the mean and on the median),
the recording time per step, the overhead between the fastest repeat of each, and PASS when the overhead on the mean is at most --max-overhead (5%).
Exit status 0 on PASS.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path

from grpo_engine.recorder import Recorder

CONSISTENT = 1.2  # repeats of one configuration whose mean s/step differ by more than this factor: a busy machine


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
    from app.db import make_engine, session_scope, upgrade_database
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


def run_once(spec, record: bool, cache_dir: Path) -> StepTimer:
    """train() once, recording in a fresh SQLite store (``record``) or nowhere (and building no groups)."""
    from app import store
    from app.db import session_scope
    from grpo_engine.trainer import train

    with recorder_for(spec, record, "recording-overhead") as (inner, url, run_id):
        timer = StepTimer(inner)
        result = train(spec if record else replace(spec, record_every=0), timer, cache_dir)
        timer.finish()
        assert result["status"] == "completed", result
        if record:
            with session_scope(url) as s:
                store.finish_run(s, run_id, "completed")
                assert [m["step"] for m in store.get_metrics(s, run_id)] == list(range(1, spec.total_steps + 1))
                assert len(store.list_groups(s, run_id, spec.total_steps)) == spec.batch_size
        return timer


def percent(on: float, off: float) -> float:
    return 100.0 * (on - off) / off


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="steps per run (steps_per_iteration)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per configuration, alternated off, on, off, on, ...")
    parser.add_argument("--cache-dir", help="built-in model cache (default: a temporary dir; the model is built there first)")
    parser.add_argument("--max-overhead", type=float, default=5.0, help="PASS when the overhead on the mean is at most this, in percent")
    args = parser.parse_args()

    from grpo_engine.config import validate_spec
    from grpo_engine.model import builtin_model_dir

    cache_dir = Path(args.cache_dir or tempfile.mkdtemp(prefix="grpo-rec-overhead-cache-")).resolve()
    spec = validate_spec({"steps_per_iteration": args.steps, "eval_every": 0})
    print(f"spec: batch {spec.batch_size} x group {spec.group_size}, max_new_tokens {spec.max_new_tokens}, "
          f"{spec.total_steps} steps, seed {spec.seed}, eval_every 0; model cache {cache_dir}", flush=True)
    try:
        t0 = time.perf_counter()
        builtin_model_dir(cache_dir, log=lambda message: print(f"  {message}", flush=True))
        print(f"built-in model ready in {time.perf_counter() - t0:.1f}s", flush=True)

        timers: dict[str, list[StepTimer]] = {"off": [], "on": []}
        for repeat in range(1, args.repeats + 1):
            for name in ("off", "on"):
                timer = run_once(spec, name == "on", cache_dir)
                timers[name].append(timer)
                print(f"repeat {repeat} {name:>3}: {sum(timer.step_seconds):7.2f}s for {len(timer.step_seconds)} steps, "
                      f"mean {statistics.fmean(timer.step_seconds):.4f}s/step, "
                      f"recording {sum(timer.recording_seconds.values()) / len(timer.step_seconds):.4f}s/step",
                      flush=True)
    finally:
        if args.cache_dir is None:
            shutil.rmtree(cache_dir, ignore_errors=True)

    return report(timers, args.max_overhead)


def report(timers: dict[str, list[StepTimer]], max_overhead: float) -> int:
    """Print the summary table and the verdict; returns the exit status."""
    reference = timers["off"][0].trajectory
    same = all(t.trajectory == reference for ts in timers.values() for t in ts)
    print(f"\nall runs sampled the same trajectory: {'yes' if same else 'NO (the comparison is less exact)'}")
    print(f"{'config':<7} {'mean s/step':>11} {'median s/step':>13} {'recording s/step':>16}  mean per repeat")
    stats = {}
    for name, ts in timers.items():
        steps = [s for t in ts for s in t.step_seconds]
        recording = sum(sum(t.recording_seconds.values()) for t in ts) / len(steps)
        stats[name] = (statistics.fmean(steps), statistics.median(steps), recording)
        per_repeat = ", ".join(f"{statistics.fmean(t.step_seconds):.4f}" for t in ts)
        print(f"{name:<7} {stats[name][0]:11.4f} {stats[name][1]:13.4f} {recording:16.4f}  {per_repeat}")
    for name, ts in timers.items():
        means = [statistics.fmean(t.step_seconds) for t in ts]
        if max(means) > CONSISTENT * min(means):
            print(f"WARNING: the {name} repeats differ by {100 * (max(means) / min(means) - 1):.0f}%: another process "
                  "probably took the CPU; rerun on an idle machine")
    on, off = stats["on"], stats["off"]
    n_on = sum(len(t.step_seconds) for t in timers["on"])
    parts = {m: sum(t.recording_seconds[m] for t in timers["on"]) / n_on for m in timers["on"][0].recording_seconds}
    print("the training loop inside DBRecorder's calls (the writes run on its writer thread), s/step: " + ", ".join(f"{m} {v:.4f}" for m, v in parts.items()))
    overhead = percent(on[0], off[0])
    print(f"overhead of recording: {overhead:+.2f}% on the mean, {percent(on[1], off[1]):+.2f}% on the median; "
          f"the loop inside DBRecorder's calls = {100 * on[2] / off[0]:.2f}% of an unrecorded step")
    fastest = {name: min(statistics.fmean(t.step_seconds) for t in ts) for name, ts in timers.items()}
    print(f"fastest repeat of each (the least disturbed by other processes): off {fastest['off']:.4f}, "
          f"on {fastest['on']:.4f} s/step, {percent(fastest['on'], fastest['off']):+.2f}%")
    ok = overhead <= max_overhead
    print(f"{'PASS' if ok else 'FAIL'} (overhead on the mean <= {max_overhead}%)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
