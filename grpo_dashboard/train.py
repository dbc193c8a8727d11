"""``grpo-dashboard train SPEC.json``: run one run spec in the foreground.

The run is created in the store (the one the dashboard shows) and trained in this process, with a
progress bar and the engine's log lines in the terminal (grpo_dashboard/progress.py); Ctrl-C cancels
it at its next step, a second Ctrl-C stops at once. Exit status: 0 when the run completed, 1 when it
did not, 2 for a spec file that cannot be read or is not a valid spec (nothing is created then).
The engine and torch are imported only when this command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from app.core.auth import mask_url
from app.core.run_status import RunStatus
from app.core.settings import get_settings

if TYPE_CHECKING:
    from grpo_engine.spec.config import RunSpec

HELP = "run one run spec (JSON file) in the foreground"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="path to a JSON run spec")


def _read_spec(path: str) -> RunSpec | None:
    """The valid run spec in the JSON file ``path``, or None after saying on stderr why there is none."""
    from grpo_engine.spec.config import SpecError, validate_spec

    try:
        return validate_spec(json.loads(Path(path).read_text()))
    except (OSError, json.JSONDecodeError) as exc:
        print(f"grpo-dashboard train: cannot read {path}: {exc}", file=sys.stderr)
    except SpecError as exc:
        print(f"grpo-dashboard train: bad run spec: {exc}", file=sys.stderr)
    return None


def _create_run(spec: RunSpec) -> int:
    """Create the run in the configured store (made and migrated if need be); return its id."""
    from app import store
    from app.store import db
    from app.store.db import session_scope

    settings = get_settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    db.upgrade_database()
    name = spec.name or store.default_run_name(spec.model)
    with session_scope() as s:
        run_id = store.create_run(s, spec.to_dict(), name)
    print(f"run {run_id} ({name}) in {mask_url(settings.database_url)}", flush=True)
    return run_id


def _train_with_progress(run_id: int) -> str:
    """Train the run in this process, drawing its progress; return execute_run's status."""
    from functools import partial

    from grpo_dashboard.progress import CancelOnCtrlC, ProgressBar, ProgressRecorder
    from workers.runner import execute_run

    progress = ProgressBar()
    try:
        with CancelOnCtrlC() as ctrl_c:
            return execute_run(run_id, partial(ProgressRecorder, progress=progress, cancel=ctrl_c.pressed))
    finally:
        progress.close()


def _report(run_id: int, status: str) -> int:
    """Print how the run ended and its last step's metrics; return the exit status."""
    from app import store
    from app.store.db import session_scope

    with session_scope() as s:
        run = store.get_run(s, run_id)
        metrics = store.get_metrics(s, run_id)
    print(f"run {run_id}: {status}" + (f" ({run['error']})" if run and run["error"] else ""))
    if metrics:
        print("final metrics: " + json.dumps(metrics[-1], indent=None, sort_keys=True))
    return 0 if status == RunStatus.COMPLETED else 1


def run(args: argparse.Namespace) -> int:
    spec = _read_spec(args.spec)
    if spec is None:
        return 2
    run_id = _create_run(spec)
    return _report(run_id, _train_with_progress(run_id))
