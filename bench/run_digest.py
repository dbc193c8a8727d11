"""What a run spec computes, as a digest: the check that a refactor left the engine's behaviour unchanged.

Runs each of two fixed specs through the engine on the CPU (the built-in model and dataset, so nothing is
downloaded): an outcome run (2 iterations of 3 steps, mu 2, so the reference reset and the clip both act) and a
process run with a learned PRM (2 iterations, so the reward model is refreshed with replay). It writes every recorded
metric except the timings (``time/*``) and every recorded group (prompts, completions, token ids, rewards, per-token
advantages) as canonical JSON, and prints one SHA-256 per spec:

    outcome  3f2a...  (6 steps, 24 groups)
    process  9b01...  (6 steps, 24 groups)

Run it in two checkouts (e.g. ``git worktree add /tmp/before <commit>``) and compare the lines; ``--out DIR`` keeps
the JSON for a diff. It imports the engine from the checkout it runs in (the current directory), through the engine's
module paths before and after the engine was split into rooms (grpo_engine/spec, train, report, ...), so one copy of
this script reads both. Unlike the other benches it imports nothing of bench/ and runs as a file, from any checkout
(``python -m bench.run_digest`` works too, from this repository's root).

    .venv/bin/python bench/run_digest.py --cache-dir /tmp/grpo-cache --out /tmp/digest-after
    cd /tmp/before && /work/main/.venv/bin/python /work/main/bench/run_digest.py --cache-dir /tmp/grpo-cache
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import sys
import tempfile
from pathlib import Path

COMMON = {"steps_per_iteration": 3, "iterations": 2, "batch_size": 4, "group_size": 4, "seed": 7}
COMMON.update({"eval_every": 3, "checkpoint_every": 0, "record_every": 1})
SPECS = {
    "outcome": {**COMMON, "policy_updates_per_batch": 2},
    "process": {**COMMON, "supervision": "process", "reward": "model", "rm_samples": 64},
}


def engine():
    """validate_spec, MemoryRecorder and train from the checkout on sys.path (its engine's layout, rooms or flat)."""
    for config, recorder, trainer in (
        ("grpo_engine.spec.config", "grpo_engine.report.recorder", "grpo_engine.train.trainer"),
        ("grpo_engine.config", "grpo_engine.recorder", "grpo_engine.trainer"),
    ):
        try:
            return (
                importlib.import_module(config).validate_spec,
                importlib.import_module(recorder).MemoryRecorder,
                importlib.import_module(trainer).train,
            )
        except ModuleNotFoundError:
            continue
    raise SystemExit("no grpo_engine here: run this from a checkout of the project")


def record(spec: dict, cache_dir: Path) -> dict:
    """One run of ``spec``: its metrics without timings and its recorded groups, as plain JSON values."""
    validate_spec, MemoryRecorder, train = engine()
    recorder = MemoryRecorder()
    with tempfile.TemporaryDirectory() as checkpoints:
        result = train(validate_spec(spec), recorder, cache_dir, device="cpu", checkpoint_dir=Path(checkpoints))
    metrics = [{k: v for k, v in m.items() if not k.startswith("time/")} for m in recorder.metrics]
    groups = {str(step): [g.to_dict() for g in gs] for step, gs in sorted(recorder.group_log.items())}
    # train() returns a TrainResult; an older engine's, a dict
    status = result["status"] if isinstance(result, dict) else result.status
    return {"status": str(status), "metrics": metrics, "groups": groups}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "grpo-dashboard-bench"))
    parser.add_argument("--out", help="write each spec's JSON here (DIR/outcome.json, DIR/process.json)")
    parser.add_argument("--only", choices=sorted(SPECS), help="one spec instead of both")
    args = parser.parse_args()
    # This script's purpose needs the one sys.path edit in bench/: run as a file (python /path/to/bench/run_digest.py),
    # Python puts this file's folder first on sys.path, not the current directory, and grpo_engine would then come
    # from the interpreter's editable install (the checkout that made the venv). The checkout to digest is the one
    # it runs in, so the current directory goes first (an entry of sys.path wins over the editable install's finder).
    sys.path.insert(0, str(Path.cwd()))
    print(f"engine: {Path(importlib.import_module('grpo_engine').__file__).parent}", flush=True)
    for name, spec in SPECS.items():
        if args.only and name != args.only:
            continue
        recorded = record(spec, Path(args.cache_dir))
        text = json.dumps(recorded, sort_keys=True, default=str)
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / f"{name}.json").write_text(text)
        steps = len([m for m in recorded["metrics"] if m["step"]])
        n_groups = sum(len(g) for g in recorded["groups"].values())
        digest = hashlib.sha256(text.encode()).hexdigest()
        print(f"{name:8s} {digest}  ({recorded['status']}, {steps} steps, {n_groups} groups)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
