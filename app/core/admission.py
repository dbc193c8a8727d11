"""The one admission of a run: the checks a run spec passes at launch on the dashboard (app.service.api.launch_run) and
again on the worker that takes it (workers.runner.execute_run), each against the settings of the machine it runs
on, so a worker with a smaller budget, other path roots, custom rewards switched off or no way to the Hub refuses
what the dashboard let through.

In order: the spec is valid (grpo_engine.spec.config.validate_spec), a step and a reward-model refresh sample within the
budget (check_budget, GRPO_MAX_TOKENS_PER_STEP), its local paths lie inside the roots and are usable
(app.core.paths.check_spec_paths, GRPO_PATH_ROOTS), its custom reward functions are allowed (check_custom_rewards,
GRPO_ALLOW_CUSTOM_REWARDS), then the caller's own checks (``placement``: at launch, where the live workers can take
it), and last, because it may wait on the network, its Hub ids are cached or confirmed (grpo_engine.spec.hub,
GRPO_HUB_CHECK_SECONDS). Each refusal is a SpecError that names the key. Pure Python: no torch, no store.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from app.core.paths import check_custom_rewards, check_spec_paths
from app.core.settings import Settings
from grpo_engine.spec.config import RunSpec, SpecError, check_budget, validate_spec
from grpo_engine.spec.hub import check_hub_ids
from grpo_engine.spec.words import run_model


def admit(spec: Any, settings: Settings, placement: Callable[[dict], None] | None = None) -> RunSpec:
    """``spec`` (a JSON object) checked as the module says, as a RunSpec; SpecError naming the key otherwise."""
    validated = validate_spec(spec)
    check_budget(validated, settings.max_tokens_per_step)
    config = validated.to_dict()
    check_spec_paths(config, settings.path_roots)
    check_custom_rewards(config, settings.path_roots, settings.allow_custom_rewards)
    if placement is not None:
        placement(config)
    check_hub_ids(config, settings.hub_check_seconds)
    return validated


def model_to_load(spec: RunSpec, settings: Settings) -> RunSpec:
    """The spec as the engine loads it on this worker: ``model: run:<id>`` (an earlier run's trained policy, which
    launch checked against the store: app.service.run_models) replaced by that policy's directory under this
    machine's checkpoint directory, ``run:<id>@<step>`` by the model directory made from that checkpoint
    (workers.run_models.make_policy_at makes it first); a spec naming no run as it is. SpecError naming ``model``
    where the directory is not there."""
    named = run_model(spec.model)
    if named is None:
        return spec
    run_id, step = named
    folder = settings.trained_policy_dir(run_id) if step is None else settings.policy_at_dir(run_id, step)
    if not (folder / "config.json").is_file():
        what = "its trained policy" if step is None else f"the policy of its checkpoint of step {step}"
        raise SpecError(
            "model",
            f"{spec.model.strip()}: {what} is not in this worker's checkpoint directory ({folder}); "
            "GRPO_CHECKPOINT_DIR must be a directory the workers and the dashboard share",
        )
    return dataclasses.replace(spec, model=str(folder))
