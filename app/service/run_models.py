"""Runs as models: ``model: run:<id>`` starts a new run, training or evaluation only, from the trained policy of an
earlier run of this dashboard (DeepSeekMath's iterative reading: evaluate what a run learned, or train it further).

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
from grpo_engine.spec.config import SpecError
from grpo_engine.spec.words import run_model_id

OFFERED_RUNS = 20  # the newest trained runs the Launch form's model field offers


def trained_runs() -> list[dict]:
    """The newest completed runs (at most OFFERED_RUNS) whose trained policy is in the checkpoint directory, as the
    model field offers them: ``{model: 'run:<id>', name}``."""
    settings = get_settings()
    with session_scope() as s:
        runs = store.list_runs(s)
    offered = []
    for run in runs:  # newest first
        if (
            run["status"] == RunStatus.COMPLETED
            and (settings.trained_policy_dir(run["run_id"]) / "config.json").is_file()
        ):
            offered.append({"model": f"run:{run['run_id']}", "name": run["name"]})
        if len(offered) == OFFERED_RUNS:
            break
    return offered


def check_run_model(config: dict) -> None:
    """Refuse (SpecError naming ``model``) a ``run:<id>`` model whose run is missing, not completed, trained
    nothing, or whose trained policy is gone from the checkpoint directory. Any other model passes."""
    run_id = run_model_id(config["model"])
    if run_id is None:
        return
    with session_scope() as s:
        run = store.get_run(s, run_id)
    if run is None:
        raise SpecError("model", f"run:{run_id} names run {run_id}, which does not exist")
    if run["status"] != RunStatus.COMPLETED:
        raise SpecError(
            "model",
            f"run:{run_id} names run {run_id}, which is {run['status']}: a run's trained policy is saved when it "
            "completes",
        )
    if run["config"].get("steps_per_iteration") == 0:
        raise SpecError("model", f"run:{run_id} names run {run_id}, which only evaluated its model: it trained none")
    if not (get_settings().trained_policy_dir(run_id) / "config.json").is_file():
        raise SpecError(
            "model",
            f"run:{run_id}: its trained policy is not in this dashboard's checkpoint directory (deleted with the run's "
            "files, or GRPO_CHECKPOINT_DIR is not the directory the workers and the dashboard share)",
        )
