"""Where a run's files lie in its directory (``<GRPO_CHECKPOINT_DIR>/run-<id>``), read without torch: by the engine
that writes them (grpo_engine.train.checkpoint), the worker that loads an earlier run's policy, and the dashboard
that checks a launch naming one and offers the downloads.

    attempt-<n>/step-<step>/   one attempt's checkpoints (the newest ``keep``); complete once state.json is there
    sealed-<n>/step-<step>/    an earlier attempt's, read-only (the newest complete one is what a resumption reads)
    final/model/               the trained policy of a completed run (a Hugging Face model directory, LoRA merged)
    final/policy.json          the dtype the model came in: {"source_dtype": ...}
    policy-at-<step>/model/    a checkpoint's policy as a model directory, made when a run names ``run:<id>@<step>``

n is 6 digits, step 8. A completed run clears its attempts (checkpoint.clear); ``final/`` and ``policy-at-*`` stay
until the run's files are deleted.
"""

from __future__ import annotations

import re
from pathlib import Path

STEP_DIR = re.compile(r"^step-(\d{8})$")
ATTEMPT_DIR = re.compile(r"^(attempt|sealed)-(\d{6})$")  # an attempt's own checkpoints; sealed: read-only
POLICY_AT_DIR = re.compile(r"^policy-at-(\d{8})$")
STATE_FILE = "state.json"  # written last: a checkpoint without it is incomplete
FINAL_DIR = "final"
FINAL_INFO = "policy.json"  # in final/: {"source_dtype": ...}


def complete(directory: Path) -> list[tuple[int, Path]]:
    """The complete checkpoints in one attempt's directory, oldest first, as (step, directory)."""
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        match = STEP_DIR.match(path.name)
        if match and (path / STATE_FILE).is_file():
            found.append((int(match.group(1)), path))
    return sorted(found)


def attempts(run_dir: Path) -> list[tuple[int, str, Path]]:
    """The attempt directories under ``run_dir`` as (number, "attempt" or "sealed", directory), by number."""
    if not run_dir.is_dir():
        return []
    found = [(int(m.group(2)), m.group(1), p) for p in run_dir.iterdir() if (m := ATTEMPT_DIR.match(p.name))]
    return sorted(found)


def step_dirs(run_dir: Path) -> list[tuple[int, Path]]:
    """The complete checkpoints of every attempt under ``run_dir``, oldest first (a step saved by two attempts: the
    later attempt's last), as (step, directory)."""
    found = [(step, number, path) for number, _, d in attempts(run_dir) for step, path in complete(d)]
    return [(step, path) for step, _, path in sorted(found)]


def checkpoint_at(run_dir: Path, step: int) -> Path | None:
    """The newest complete checkpoint of ``step`` under ``run_dir``, or None where there is none (never saved, or
    pruned: an attempt keeps its newest ``keep``, a completed run none)."""
    found = [path for s, path in step_dirs(run_dir) if s == step]
    return found[-1] if found else None


def policy_at_steps(run_dir: Path) -> set[int]:
    """The steps whose checkpoint's policy a run already made a model directory of (:func:`policy_at_dir`)."""
    if not run_dir.is_dir():
        return set()
    found = [(m, p) for p in run_dir.iterdir() if (m := POLICY_AT_DIR.match(p.name))]
    return {int(m.group(1)) for m, p in found if (p / "model" / "config.json").is_file()}


def policy_at_dir(run_dir: Path, step: int) -> Path:
    """Where the policy of the checkpoint of ``step`` is kept as a model directory once a run has named it
    (``run:<id>@<step>``): ``policy-at-<step>/model``."""
    return run_dir / f"policy-at-{step:08d}" / "model"
