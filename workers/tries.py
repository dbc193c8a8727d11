"""A question tried by hand, on a worker: the try's models loaded (the run's starting model, a kept checkpoint's
policy, its trained policy) and G outputs of each sampled and scored as the run would (grpo_engine.rollout.tries).

Tries come on their own queue (app.core.broker.tries_queue), to workers started for it, so a worker busy training
never holds one. A try is claimed once (a redelivered message finds it taken), and one the dashboard stopped
waiting for (expired) is skipped, or its outputs dropped. The two models tried last stay loaded: trying the same
run again costs no loading.
"""

from __future__ import annotations

import logging
import time
import traceback
from dataclasses import replace
from functools import lru_cache

from app import store
from app.core.settings import get_settings
from app.store.db import session_scope
from grpo_engine.spec.config import RunSpec, validate_spec
from workers.errors import one_line
from workers.run_models import run_model_to_load

logger = logging.getLogger("grpo.worker")


def choice_model(spec: RunSpec, run_id: int, choice: str) -> RunSpec:
    """The run spec with the model a try's ``choice`` names: 'start' the run's own model, 'final' its trained policy
    (``run:<id>``), a step number its checkpoint's policy (``run:<id>@<step>``)."""
    if choice == "start":
        return spec
    return replace(spec, model=f"run:{run_id}" if choice == "final" else f"run:{run_id}@{int(choice)}")


@lru_cache(maxsize=2)
def _loaded(path: str, device: str):
    """(model, tokenizer) of the model at ``path``, kept for the next try (model directories do not change)."""
    import torch

    from grpo_engine.model.model import load_policy

    return load_policy(path, get_settings().cache_dir, torch.device(device), log=lambda message: None)


def _device(spec: RunSpec) -> str:
    import torch

    return "cuda" if spec.device != "cpu" and torch.cuda.is_available() else "cpu"


def _outputs(spec: RunSpec, request: dict, deadline: float) -> list[dict]:
    """Each model of the try: ``{model, seconds, outputs}``; stops with TimeoutError past ``deadline``, between
    models or inside a model's sampling."""
    from grpo_engine.rollout.tries import try_outputs  # torch: in the worker only

    settings, run_id, tried = get_settings(), request["run_id"], []
    late = TimeoutError(f"the try took longer than its time_limit of {request['time_limit']:g} s")
    for choice in request["models"]:
        if time.monotonic() > deadline:
            raise late
        started = time.monotonic()
        model_spec = run_model_to_load(choice_model(spec, run_id, choice), settings, log=logger.info)
        policy, tokenizer = _loaded(model_spec.model, _device(spec))
        how = {"g": request["g"], "max_new_tokens": request["max_new_tokens"], "seed": request["seed"]}
        try:
            outputs = try_outputs(
                policy, tokenizer, spec, request["question"], request["reference"], deadline=deadline, **how
            )
        except TimeoutError as exc:  # sampling stopped between two tokens
            raise late from exc
        tried.append({"model": choice, "seconds": round(time.monotonic() - started, 2), "outputs": outputs})
    return tried


def execute_try(try_id: int) -> str:
    """Claim try ``try_id``, sample its outputs and record them (or its error). Returns its status: done, failed,
    or 'skipped' where it was not waiting any more."""
    with session_scope() as s:
        claimed = store.claim_try(s, try_id)
        run = store.get_run(s, claimed["run_id"]) if claimed else None
    if claimed is None:
        return "skipped"
    request = {**claimed["request"], "run_id": claimed["run_id"]}
    deadline = time.monotonic() + float(request["time_limit"])
    try:
        if run is None:
            raise LookupError(f"run {claimed['run_id']} does not exist")
        result, error = _outputs(validate_spec(run["config"]), request, deadline), None
    except Exception as exc:
        logger.warning("try %s failed:\n%s", try_id, traceback.format_exc())
        result, error = None, one_line(exc)
    with session_scope() as s:
        recorded = store.finish_try(s, try_id, result, error)
    return ("failed" if error else "done") if recorded else "skipped"
