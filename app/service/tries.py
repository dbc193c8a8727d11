"""Try a question: G outputs of one or two of a run's models (its starting model, a kept checkpoint's policy, its
trained policy) to a question the user types or picks from the run's, side by side, each scored by the run's
rewards with the answer its verifier read and each token's log-prob.

The web process never imports torch: :func:`try_question` stores the try (app.store.tries), sends it to the tries
queue (app.core.broker.send_try) and waits for a worker serving that queue (workers/tries.py) to record its
outputs. Such a worker takes nothing else, so a run training elsewhere never holds a try: ``serve`` starts one
beside its embedded worker; with external workers, ``grpo-dashboard worker --queue <GRPO_QUEUE>.tries`` starts
one. Each try is bounded (TRY_BOUNDS: G, max_new_tokens, time_limit) and refused beyond, naming the bound; a try
still unfinished at its time limit is reported as such and its outputs, if they come later, are dropped.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from app import store
from app.core import broker
from app.core.run_status import RunStatus
from app.core.settings import get_settings
from app.service.api import ApiError, require_run
from app.service.run_models import kept_steps
from app.store.db import session_scope
from grpo_engine.spec.words import MAX_TEXT

# each bound: (smallest, largest); refused beyond, naming the bound
TRY_BOUNDS = {"g": (1, 16), "max_new_tokens": (1, 1024), "time_limit": (5, 600), "models": (1, 2)}
DEFAULT_G = 4
DEFAULT_TIME_LIMIT = 120.0
OFFERED_QUESTIONS = 50  # the run's questions the panel offers at most
POLL_SECONDS = 0.25  # how often the dashboard looks at the store for the try's outputs


def try_models(run_id: int) -> list[dict]:
    """The models of run ``run_id`` a try can sample from, in order: ``{model, label}`` with model 'start' (the
    run's starting model), each kept checkpoint's step (its policy) and 'final' (a completed run's trained policy).
    """
    settings = get_settings()
    with session_scope() as s:
        run = require_run(s, int(run_id))
    offered = [{"model": "start", "label": f"starting model ({run['config'].get('model')})"}]
    # an evaluation-only run keeps no checkpoint and saves no trained policy: it offers its starting model alone
    offered += [{"model": str(step), "label": f"checkpoint of step {step}"} for step in kept_steps(run["run_id"])]
    if run["status"] == RunStatus.COMPLETED and (settings.trained_policy_dir(run["run_id"]) / "config.json").is_file():
        offered.append({"model": "final", "label": "trained policy (final)"})
    return offered


def try_questions(run_id: int) -> list[dict]:
    """Questions of run ``run_id`` to pick from: ``{question, reference, split}``, its held-out ones (as its latest
    evaluation recorded them) first, then those it trained on; at most OFFERED_QUESTIONS."""
    with session_scope() as s:
        require_run(s, int(run_id))
        return store.run_questions(s, int(run_id), OFFERED_QUESTIONS)


@dataclass(frozen=True)
class TryRequest:
    """A try as the worker reads it (its ``request`` column)."""

    models: list[str]
    question: str
    reference: str
    g: int
    max_new_tokens: int
    seed: int
    time_limit: float


def _bounded(name: str, value: Any, kind=int) -> Any:
    low, high = TRY_BOUNDS[name]
    try:
        number = kind(value)
    except (TypeError, ValueError):
        raise ApiError(f"{name}: {value!r} is not a number", key=name) from None
    if not low <= number <= high:
        raise ApiError(f"{name}: {value!r} is out of bounds; a try takes {low} to {high}", key=name)
    return number


def _models(run_id: int, models: Any) -> list[str]:
    """The picked models, each one the run offers (try_models), named as the worker reads them."""
    picked = [models] if isinstance(models, (str, int)) else list(models or [])
    picked = [str(m).strip().removeprefix("step").strip() for m in picked]
    if not picked:
        raise ApiError("models: pick one or two of the run's models", key="models")
    _bounded("models", len(picked))
    offered = [m["model"] for m in try_models(run_id)]
    for model in picked:
        if model not in offered:
            raise ApiError(
                f"models: run {run_id} has no model {model!r} to try; it offers {', '.join(offered)}", "models"
            )
    if len(set(picked)) < len(picked):
        raise ApiError("models: the same model picked twice", key="models")
    return picked


def make_request(run_id: int, models: Any, question: str, reference: str = "", **bounds: Any) -> TryRequest:
    """The try's request, every field checked (ApiError naming the field); ``bounds``: ``g``, ``max_new_tokens``
    (default: the run's), ``seed``, ``time_limit``."""
    with session_scope() as s:
        run = require_run(s, int(run_id))
    question, reference = (question or "").strip(), (reference or "").strip()
    if not question:
        raise ApiError("question: type a question, or pick one of the run's", key="question")
    for name, text in (("question", question), ("reference", reference)):
        if len(text) > MAX_TEXT:
            raise ApiError(f"{name}: {len(text)} characters; at most {MAX_TEXT}", key=name)
    asked = bounds.get("max_new_tokens")  # default: the run's, within the bound
    max_new = asked if asked else min(int(run["config"].get("max_new_tokens", 256)), TRY_BOUNDS["max_new_tokens"][1])
    return TryRequest(
        models=_models(int(run_id), models),
        question=question,
        reference=reference,
        g=_bounded("g", bounds.get("g") or DEFAULT_G),
        max_new_tokens=_bounded("max_new_tokens", max_new),
        seed=int(bounds.get("seed") or 0),
        time_limit=_bounded("time_limit", bounds.get("time_limit") or DEFAULT_TIME_LIMIT, float),
    )


def _serving() -> bool:
    """Is a live worker (reported within 2 x GRPO_LEASE_SECONDS) consuming the tries queue?"""
    settings = get_settings()
    queue = broker.tries_queue(settings.queue)
    with session_scope() as s:
        return any(queue in w["queues"] for w in store.live_workers(s, 2 * settings.lease_seconds))


def try_question(run_id: int, models: Any, question: str, reference: str = "", **bounds: Any) -> dict:
    """Try ``question`` on run ``run_id``'s ``models`` (one or two of try_models: 'start', a step, 'final') and wait
    for the outputs: ``{try_id, run_id, question, reference, reward_weights, models: [{model, label, seconds,
    outputs}]}`` (``reward_weights``: each named reward of the run to its weight, as /get_group gives it), each
    output ``{completion, tokens, logprobs, ended, answer, answer_rule, reward, components, reward_error}``
    (grpo_engine.rollout.tries). ApiError naming the field for a bad request; ApiError when no worker serves tries,
    when the try failed, or when it did not finish within its time limit."""
    request = make_request(run_id, models, question, reference, **bounds)
    if not _serving():
        queue = broker.tries_queue(get_settings().queue)
        raise ApiError(
            f"no worker serves tries (queue {queue!r}); start one with `grpo-dashboard worker --queue {queue}` "
            "(`grpo-dashboard serve` starts one with its embedded worker)"
        )
    with session_scope() as s:
        try_id = store.create_try(s, int(run_id), request.__dict__)
    broker.send_try(try_id)
    done = _wait(try_id, request.time_limit)
    labels = {m["model"]: m["label"] for m in try_models(int(run_id))}
    tried = [{**m, "label": labels.get(m["model"], m["model"])} for m in done["result"]]
    with session_scope() as s:
        rewards = require_run(s, int(run_id))["config"].get("rewards") or []
    return {"try_id": try_id, "run_id": int(run_id), "question": request.question, "reference": request.reference,
            "reward_weights": {r["name"]: r["weight"] for r in rewards}, "models": tried}  # fmt: skip


def _wait(try_id: int, time_limit: float) -> dict:
    """The try once done; ApiError when it failed or is still unfinished after ``time_limit`` s (then expired)."""
    deadline = time.monotonic() + time_limit
    while True:
        with session_scope() as s:
            got = store.get_try(s, try_id)
            if got["status"] in ("queued", "running") and time.monotonic() > deadline:
                store.expire_try(s, try_id)
                queued = got["status"] == "queued"
                waiting = "no tries worker was free to take it" if queued else "the worker was still sampling"
                raise ApiError(f"try {try_id} did not finish within its time_limit of {time_limit:g} s ({waiting})")
        if got["status"] == "done":
            return got
        if got["status"] == "failed":
            raise ApiError(f"try {try_id} failed: {got['error']}")
        time.sleep(POLL_SECONDS)
