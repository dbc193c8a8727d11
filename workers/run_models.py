"""A run whose model is a checkpoint of an earlier run (``model: run:<id>@<step>``): the worker makes that
checkpoint's policy a model directory, once, beside the earlier run's checkpoints
(app.core.settings.Settings.policy_at_dir; grpo_engine.train.checkpoint.save_policy_at), and the run loads it like
any model directory (app.core.admission.model_to_load). The directory stays when the checkpoint is pruned, so a
later run naming the same step reads it again; it goes with the earlier run's files.

Launch checked the run and the step against the store and the checkpoint directory
(app.service.run_models.check_run_model). A checkpoint pruned since (its run still training) fails the run, naming
``model``.
"""

from __future__ import annotations

from app import store
from app.core.admission import model_to_load
from app.core.settings import Settings
from app.store.db import session_scope
from grpo_engine.report.run_files import checkpoint_at
from grpo_engine.spec.config import RunSpec, SpecError, validate_spec
from grpo_engine.spec.words import run_model


def make_policy_at(spec: RunSpec, settings: Settings, log=print) -> None:
    """Where ``spec`` names ``run:<id>@<step>`` and its model directory is not made yet: make it from the
    checkpoint (the earlier run's own model first, where that is a checkpoint too). Any other model: nothing."""
    named = run_model(spec.model)
    if named is None or named[1] is None:
        return
    run_id, step = named
    out = settings.policy_at_dir(run_id, step)
    if (out / "config.json").is_file():
        return
    with session_scope() as s:
        earlier = store.get_run(s, run_id)
    if earlier is None:
        raise SpecError("model", f"{spec.model.strip()} names run {run_id}, which does not exist")
    checkpoint = checkpoint_at(settings.run_dir(run_id), step)
    if checkpoint is None:
        raise SpecError(
            "model", f"{spec.model.strip()}: run {run_id} no longer keeps a checkpoint of step {step} (pruned)"
        )
    earlier_spec = validate_spec(earlier["config"])
    make_policy_at(earlier_spec, settings, log)
    from grpo_engine.train.checkpoint import save_policy_at  # torch: in the worker only

    try:
        save_policy_at(model_to_load(earlier_spec, settings), checkpoint, out.parent, settings.cache_dir, log=log)
    except OSError:
        if not (out / "config.json").is_file():  # else another worker made the same directory meanwhile
            raise


def run_model_to_load(spec: RunSpec, settings: Settings, log=print) -> RunSpec:
    """The spec as this worker's engine loads it: a run's policy it names made first where it is a checkpoint's
    (:func:`make_policy_at`), then its directory in place of ``run:<id>[@<step>]`` (model_to_load)."""
    make_policy_at(spec, settings, log)
    return model_to_load(spec, settings)
