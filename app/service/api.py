"""The dashboard's API: plain functions, JSON in and JSON out.

The Gradio endpoints (app/web/endpoints.py) are thin wrappers around these (and around app.service.exports and
app.service.datasets), so the same checks
apply to the browser form and to ``gradio_client``. Bad input raises :class:`ApiError`
with a message meant for the caller (a bad run spec names the key).

A launch writes the run row first (status ``queued``) and then sends the job to the
broker by task name, so this process never imports torch (the engine's modules it uses are torch-free).
"""

from __future__ import annotations

import json
from typing import Any

from app import store
from app.core.admission import admit
from app.core.auth import mask_secrets, mask_url
from app.core.broker import send_run
from app.core.run_status import RunStatus
from app.core.settings import get_settings
from app.service.placement import check_placement
from app.service.run_health import run_warnings
from app.service.run_models import check_run_model
from app.service.step_detail import step_details
from app.store.db import session_scope
from grpo_engine.spec.config import SpecError, shown, validate_spec
from grpo_engine.spec.presets import PRESETS


class ApiError(ValueError):
    """A request was refused; the message says why. ``key``: the run-spec key a refused spec names (SpecError's),
    else None, so that a form can mark that field without reading the message."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


MAX_ID = 2**31 - 1  # the store's integer keys (PostgreSQL integer)


def as_id(value: Any, what: str = "run_id", low: int = 1) -> int:
    """Accept 12, 12.0 and "12" (clients send ids in all three shapes), from ``low`` to MAX_ID."""
    number = None
    if isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and len(value) <= 20:
        try:
            number = int(value.strip())
        except ValueError:
            pass
    if number is None or not low <= number <= MAX_ID:
        raise ApiError(f"{what} must be an integer from {low} to {MAX_ID}, got {shown(value)}")
    return number


def checked_text(value: Any, what: str, max_length: int) -> str:
    """``value`` as text: a string of at most ``max_length`` characters with no NUL, or ApiError naming ``what``."""
    if not isinstance(value, str):
        raise ApiError(f"{what} must be a string, got {type(value).__name__} {shown(value)}")
    if len(value) > max_length:
        raise ApiError(f"{what} must be at most {max_length} characters, got {len(value)}")
    if "\0" in value:
        raise ApiError(f"{what} must not contain a NUL character")
    return value


def require_run(s, run_id: int) -> dict:
    """The run ``run_id`` as store.get_run gives it, or ApiError "run N not found"."""
    run = store.get_run(s, run_id)
    if run is None:
        raise ApiError(f"run {run_id} not found")
    return run


def parse_spec(spec: Any) -> Any:
    """A run spec given as JSON text made an object (empty text: ``{}``); anything else as it is, for validate_spec
    to judge. Text that is not JSON is refused (ApiError)."""
    if not isinstance(spec, str):
        return spec
    try:
        return json.loads(spec) if spec.strip() else {}
    except json.JSONDecodeError as e:
        raise ApiError(f"the run spec is not valid JSON: {e}") from None


def launch_run(spec: dict | str | None) -> dict:
    """Validate a run spec, store the run (queued) and send it to the workers.

    ``spec`` is a JSON object, or its text. Returns ``{run_id, status}``. A refused spec (a bad value, a
    local path outside GRPO_PATH_ROOTS or unusable, a custom reward function without GRPO_ALLOW_CUSTOM_REWARDS,
    a bad dataset file, a local model too big for every
    GPU of the live workers: app.service.placement, a Hub id that is not cached and that the Hub does not
    confirm within GRPO_HUB_CHECK_SECONDS: grpo_engine.spec.hub) stores nothing.
    """
    # 1. parse and validate (missing keys take defaults; a bad key is named)
    spec = parse_spec(spec)
    settings = get_settings()
    try:
        config = admit(spec, settings, placement=check_placement).to_dict()
        check_run_model(config)  # run:<id>: an earlier run's trained policy, still there
    except SpecError as e:
        raise ApiError(str(e), key=e.key) from None
    config["name"] = config["name"] or store.default_run_name(config["model"])

    # 2. the row comes first, so a worker that picks the job up finds it
    with session_scope() as s:
        run_id = store.create_run(s, config, config["name"])

    # 3. enqueue by name on the broker the settings name now
    try:
        send_run(run_id, config["device"])
    except Exception as e:  # any broker failure: the run can never start
        error = mask_secrets(f"could not reach the broker at {mask_url(settings.broker_url)}: {e}", settings)
        with session_scope() as s:
            store.finish_run(s, run_id, RunStatus.FAILED, error=error)
        raise ApiError(f"run {run_id} failed: {error}") from e
    return {"run_id": run_id, "status": RunStatus.QUEUED}


def list_presets() -> list[dict]:
    """The presets, in the Launch form's order: ``[{name, spec}]``, ``spec`` the keys the preset sets over the
    defaults (a run spec /launch_run takes as it is)."""
    return [{"name": name, "spec": json.loads(json.dumps(spec))} for name, spec in PRESETS.items()]


def list_runs() -> list[dict]:
    """Every run, newest first."""
    with session_scope() as s:
        return store.list_runs(s)


def store_snapshot() -> tuple[list[dict], tuple[int, int, int]]:
    """Every run (as list_runs) and the newest metric, group and log-line ids (store.latest_writes), in one
    transaction: the page's timer compares them with its last tick's to know whether anything changed."""
    with session_scope() as s:
        return store.list_runs(s), store.latest_writes(s)


def get_run(run_id: Any) -> dict:
    """One run: status, config, progress, error and timestamps, and its health ``warnings`` (app.service.run_health: each
    {rule, title, message, steps, metrics, severity}; [] while nothing looks wrong)."""
    run_id = as_id(run_id)
    with session_scope() as s:
        return run_view(s, require_run(s, run_id))


def run_view(s, run: dict) -> dict:
    """A run as /get_run (and every endpoint that returns "the run as /get_run") gives it: the store's run with its
    health ``warnings``."""
    return {**run, "warnings": run_warnings(s, run)}


def get_metrics(run_id: Any) -> list[dict]:
    """Per-step metrics of a run, ordered by step."""
    run_id = as_id(run_id)
    with session_scope() as s:
        require_run(s, run_id)
        return store.get_metrics(s, run_id)


MAX_LOG_LINES = 10_000  # the most log lines one get_logs call returns


def get_logs(run_id: Any, limit: Any = 200) -> list[str]:
    """The newest ``limit`` log lines of a run (1 to MAX_LOG_LINES; None: 200), oldest first."""
    run_id = as_id(run_id)
    limit = 200 if limit is None else as_id(limit, "limit")
    if limit > MAX_LOG_LINES:
        raise ApiError(f"limit must be an integer from 1 to {MAX_LOG_LINES}, got {limit}")
    with session_scope() as s:
        require_run(s, run_id)
        return store.get_logs(s, run_id, limit)


def group_steps(run_id: Any) -> list[int]:
    """Steps of a run that have recorded groups, ascending."""
    run_id = as_id(run_id)
    with session_scope() as s:
        require_run(s, run_id)
        return store.group_steps(s, run_id)


def list_groups(run_id: Any, step: Any = None, order: Any = None) -> list[dict]:
    """Groups sampled at ``step`` (None or "": the latest step that has groups), sorted by ``order``:
    "position" (sampling order, the default), "spread" (reward std, largest first), "mean" (reward mean,
    highest first) or "mean_asc"."""
    run_id = as_id(run_id)
    step = None if step is None or step == "" else as_id(step, "step", low=0)
    order = order or "position"
    if order not in store.GROUP_ORDERS:
        raise ApiError(f"order must be one of {', '.join(store.GROUP_ORDERS)}, got {shown(order)}")
    with session_scope() as s:
        require_run(s, run_id)
        return store.list_groups(s, run_id, step, order)


def get_group(group_id: Any) -> dict:
    """One group with its G samples: tokens, rewards and per-token advantages; ``step_labels`` says where a
    process-supervised run's step rewards came from and ``step_label_rule`` which rule labels its steps (both
    None for outcome supervision). Each sample carries its ``steps`` (app.service.step_detail.sample_steps: text, the
    rules' label and share, the PRM's score, the reward and its normalisation over the group; [] for outcome).
    ``reward_weights`` maps each named reward of the run's ``rewards`` to its weight ({} without any).
    ``rm_version``: with a learned reward model, the version that scored the group (:func:`rm_version`; else None)."""
    group_id = as_id(group_id, "group_id")
    with session_scope() as s:
        group = store.get_group(s, group_id)
        run = store.get_run(s, group["run_id"]) if group is not None else None
    if group is None:
        raise ApiError(f"group {group_id} not found")
    config = run["config"] if run else {}
    steps = step_details(group["samples"], prm=config.get("reward") == "model")
    return {
        **group,
        "samples": [{**sample, "steps": st} for sample, st in zip(group["samples"], steps, strict=True)],
        "step_labels": step_label_source(config),
        "step_label_rule": step_label_rule(config),
        "reward_weights": {r["name"]: r["weight"] for r in config.get("rewards") or ()},
        "rm_version": rm_version(config, group["step"]),
    }


def rm_version(config: dict, step: int) -> int | None:
    """With ``reward: model``, the version of the reward model that scored the groups of ``step``: 1 is its first
    training (before step 1), k + 1 its refresh after iteration k (at the last step of the iteration, once that
    step's groups were scored); None without a learned reward model.

    >>> rm_version({"reward": "model", "steps_per_iteration": 10}, 10), rm_version({"reward": "model",
    ...     "steps_per_iteration": 10}, 11), rm_version({"reward": "rule"}, 3)
    (1, 2, None)
    """
    if config.get("reward") != "model":
        return None
    return 1 + (max(step, 1) - 1) // max(int(config.get("steps_per_iteration") or 1), 1)


def step_label_source(config: dict) -> str | None:
    """Where a run's step rewards come from, in words: a learned PRM, or which rule labels the steps.

    >>> step_label_source({"supervision": "process", "reward": "rule", "step_labels": "rollouts",
    ...                    "label_rollouts": 4, "label_estimate": "hard", "dataset": "/data/gsm8k.jsonl"})
    'rollouts, N=4, hard estimate'
    >>> step_label_source({"supervision": "outcome"}) is None
    True
    """
    if config.get("supervision") == "process" and config.get("reward") == "model":
        return "the learned PRM's scores"
    return step_label_rule(config)


def step_label_rule(config: dict) -> str | None:
    """The rule that labels a process run's steps, in words (with a learned PRM too: its checker's verdicts are
    recorded beside the PRM's scores); None for outcome supervision.

    >>> step_label_rule({"supervision": "process", "reward": "model", "step_labels": "arithmetic"})
    'the arithmetic step checker'
    """
    if config.get("supervision") != "process":
        return None
    try:
        return validate_spec(config).label_source  # RunSpec.label_source: the one wording
    except SpecError:  # a config stored under keys this version no longer has, or refuses now
        return "the rules' step checker"


def cancel_run(run_id: Any) -> dict:
    """Cancel a run: a queued run at once, a running one at its next step boundary."""
    run_id = as_id(run_id)
    with session_scope() as s:
        require_run(s, run_id)
        return store.request_cancel(s, run_id)


def compare_runs(run_ids: Any) -> dict:
    """Several runs side by side: ``{runs: [get_run each], differing_keys: [...], metrics: {"<run_id>": [...]}}``.

    ``differing_keys`` are the run-spec keys whose values are not the same in every run (``name`` aside).
    """
    if isinstance(run_ids, str):
        run_ids = [x for x in run_ids.replace(",", " ").split() if x]
    if not isinstance(run_ids, (list, tuple)) or not run_ids:
        raise ApiError(f"run_ids must be a non-empty list of run ids, got {shown(run_ids)}")
    ids = list(dict.fromkeys(as_id(r) for r in run_ids))  # order kept, duplicates dropped
    with session_scope() as s:
        runs = [run_view(s, require_run(s, run_id)) for run_id in ids]
        metrics = {str(run_id): store.get_metrics(s, run_id) for run_id in ids}
    keys = sorted({k for r in runs for k in r["config"]} - {"name"})
    differing = [k for k in keys if len({json.dumps(r["config"].get(k), sort_keys=True) for r in runs}) > 1]
    return {"runs": runs, "differing_keys": differing, "metrics": metrics}
