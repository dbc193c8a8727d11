"""Runs as models: ``model: run:<id>`` starts a new run, training or evaluation only, from the trained policy of an
earlier run of this dashboard (DeepSeekMath's iterative reading: evaluate what a run learned, or train it further);
``model: run:<id>@<step>`` from the policy of one of its kept checkpoints (a run keeps its newest ``checkpoint_keep``
checkpoints while it trains and after it fails or is cancelled; a completed run only its trained policy).

Launch checks the run against the store and the checkpoint directory (:func:`check_run_model`): it must exist, have
completed a training (not an evaluation only), and its trained policy (app.core.settings.Settings.trained_policy_dir)
must still be there; each refusal names ``model``. The worker loads that directory in its place
(workers.runner, app.core.settings), so the new run's config keeps ``run:<id>``.
"""

from __future__ import annotations

from app import store
from app.core.run_status import RunStatus
from app.core.settings import get_settings
from app.store.db import session_scope
from grpo_engine.report.run_files import policy_at_steps, step_dirs
from grpo_engine.spec.config import SpecError
from grpo_engine.spec.words import run_model

OFFERED_RUNS = 20  # the newest trained runs the Launch form's model field offers


def trained_runs() -> list[dict]:
    """The newest runs (at most OFFERED_RUNS) with a policy a new run can start from, as the model field offers
    them: ``{model: 'run:<id>', name}`` for a completed run's trained policy, ``{model: 'run:<id>@<step>', name,
    step}`` for each checkpoint a run keeps (a run still training, failed or cancelled keeps its newest ones)."""
    settings = get_settings()
    with session_scope() as s:
        runs = store.list_runs(s)
    offered, runs_offered = [], 0
    for run in runs:  # newest first (an evaluation-only run has neither a trained policy nor checkpoints)
        run_id, name = run["run_id"], run["name"]
        kept = [{"model": f"run:{run_id}@{step}", "name": name, "step": step} for step in kept_steps(run_id)]
        if run["status"] == RunStatus.COMPLETED and (settings.trained_policy_dir(run_id) / "config.json").is_file():
            kept.insert(0, {"model": f"run:{run_id}", "name": name})
        offered.extend(kept)
        runs_offered += bool(kept)
        if runs_offered == OFFERED_RUNS:
            break
    return offered


def kept_steps(run_id: int) -> list[int]:
    """The steps of ``run_id`` a new run can start from, in order: its complete checkpoints (a sharded run's too: the
    worker makes its shards one policy), and those a run already made a model directory of (kept after the
    checkpoint is pruned)."""
    run_dir = get_settings().run_dir(run_id)
    return sorted({step for step, _ in step_dirs(run_dir)} | policy_at_steps(run_dir))


def check_run_model(config: dict) -> None:
    """Refuse (SpecError naming ``model``) a ``run:<id>`` model whose run is missing, not completed, trained
    nothing, or whose trained policy is gone from the checkpoint directory; a ``run:<id>@<step>`` whose run is
    missing, trained nothing, or keeps no checkpoint of that step. Any other model passes."""
    named = run_model(config["model"])
    if named is None:
        return
    run_id, step = named
    with session_scope() as s:
        run = store.get_run(s, run_id)
    shown = config["model"].strip()
    if run is None:
        raise SpecError("model", f"{shown} names run {run_id}, which does not exist")
    if run["config"].get("steps_per_iteration") == 0:
        raise SpecError("model", f"{shown} names run {run_id}, which only evaluated its model: it trained none")
    if step is None:
        _check_trained_policy(run)
    elif step not in (kept := kept_steps(run_id)):
        if kept:
            where = f"it keeps steps {', '.join(map(str, kept))}"
        elif run["status"] == RunStatus.COMPLETED:
            where = f"a completed run keeps none: run:{run_id} is its trained policy"
        else:
            where = "it keeps none"
        raise SpecError("model", f"{shown}: run {run_id} keeps no checkpoint of step {step} ({where})")


def _check_trained_policy(run: dict) -> None:
    """Refuse ``run:<id>`` where the run has not completed or its trained policy is gone from the directory."""
    run_id = run["run_id"]
    if run["status"] != RunStatus.COMPLETED:
        raise SpecError(
            "model",
            f"run:{run_id} names run {run_id}, which is {run['status']}: a run's trained policy is saved when it "
            "completes (run:<id>@<step> names one of its kept checkpoints)",
        )
    if not (get_settings().trained_policy_dir(run_id) / "config.json").is_file():
        raise SpecError(
            "model",
            f"run:{run_id}: its trained policy is not in this dashboard's checkpoint directory (deleted with the run's "
            "files, or GRPO_CHECKPOINT_DIR is not the directory the workers and the dashboard share)",
        )
