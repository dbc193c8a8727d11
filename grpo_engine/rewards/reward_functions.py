"""Named rewards: the run spec's ``rewards``, a list of ``{"name", "weight"}``, each a function that scores one output.

Every reward function has the signature ``(question, completion, reference, **row) -> float`` (process supervision:
``-> list[float]``, one number per step). ``row`` holds the dataset row's other fields (``solution``) and what the
engine knows of the output: ``correct`` (the verifier's verdict, 1.0 or 0.0, under the run's ``answer_match``),
``answer_match`` (the run's rule, 'strict' or 'flexible'), ``completion_tokens`` (its length in tokens, end token
included), ``max_new_tokens`` (the run's) and, with process supervision, ``steps`` (its steps' texts). An output's
reward is the weighted sum of its rewards; each reward's own value (unweighted) is recorded in the sample's
``reward_components`` under its name.

The built-ins (:data:`BUILTINS`) are outcome rewards: ``accuracy``, ``format``, ``length``, ``repetition``. A custom
reward is named like a built-in: ``module:function`` (or its name) declared by an installed package in the entry
point group ``grpo_dashboard.rewards``, or ``/path/to/file.py:function`` (inside GRPO_PATH_ROOTS, checked by
app.core.paths). Custom rewards run user code, so they are off unless the operator sets GRPO_ALLOW_CUSTOM_REWARDS=1.
Pure Python: no torch.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import math
import numbers
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grpo_engine.rewards.builtin_rewards import BUILTINS

ENTRY_POINT_GROUP = "grpo_dashboard.rewards"  # where installed packages declare their reward functions
SWITCH = "GRPO_ALLOW_CUSTOM_REWARDS"  # the operator's switch for custom rewards (dashboard and workers)
MAX_NAME = 1000  # the longest reward name (a file path and a function)
SHOWN_CHARS = 200  # how much of a question or a completion a failed reward's error quotes


# ---- the rewards key --------------------------------------------------------------------------------


def file_reference(name: str) -> tuple[str, str] | None:
    """A reward in a file, ``/path/to/file.py:function``, as (path, function); None for any other name.

    >>> file_reference("/data/my_rewards.py:brevity"), file_reference("my_rewards:brevity")
    (('/data/my_rewards.py', 'brevity'), None)
    """
    path, sep, function = name.rpartition(":")
    return (path, function) if sep and path.endswith(".py") else None


def declared() -> dict[str, str]:
    """The reward functions installed packages declare (entry point group grpo_dashboard.rewards): name -> value
    ("module:function")."""
    return {ep.name: ep.value for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _builtin_list() -> str:
    return ", ".join(BUILTINS)


def check_reward_list(items: list | tuple) -> list[dict]:
    """The ``rewards`` key's items checked and normalised to ``{"name": str, "weight": float}`` (weight 1.0 when
    left out); a ValueError says what is wrong: not an object, an unknown name (listing the built-ins), a weight
    that is not a finite number, a name given twice.

    >>> check_reward_list([{"name": "accuracy"}, {"name": "length", "weight": 0.5}])
    [{'name': 'accuracy', 'weight': 1.0}, {'name': 'length', 'weight': 0.5}]
    """
    out, seen = [], set()
    for k, item in enumerate(items):
        if not isinstance(item, dict) or not set(item) <= {"name", "weight"}:
            raise ValueError(f'item {k} must be an object {{"name": ..., "weight": ...}}, got {str(item)[:60]}')
        name, weight = item.get("name"), item.get("weight", 1.0)
        if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME or "\x00" in name:
            raise ValueError(
                f"item {k}: name must be a reward's name (one of {_builtin_list()}, or a custom "
                f"'module:function' or '/path/file.py:function'), got {str(name)[:60]!r}"
            )
        name = name.strip()
        if name not in BUILTINS and ":" not in name and name not in declared():
            raise ValueError(
                f"unknown reward {name!r}: the built-ins are {_builtin_list()}; a custom reward is "
                f"'module:function' (declared in the entry point group {ENTRY_POINT_GROUP}) or "
                "'/path/file.py:function'"
            )
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise ValueError(f"{name!r}: weight must be a finite number, got {str(weight)[:60]!r}")
        if name in seen:
            raise ValueError(f"{name!r} is given twice")
        seen.add(name)
        out.append({"name": name, "weight": float(weight)})
    return out


def check_rewards_apply(rewards: list[dict], supervision: str) -> None:
    """Refuse (ValueError) named rewards the run would not use as asked: a built-in (an outcome reward) with process
    supervision. (When they are read at all, and format_reward beside them: grpo_engine.spec.applicability.)"""
    builtin = [r["name"] for r in rewards if r["name"] in BUILTINS]
    if supervision == "process" and builtin:
        raise ValueError(
            f"{builtin[0]!r} is an outcome reward (one number per output); with supervision 'process' "
            "rewards may only hold custom functions that return one number per step"
        )


def check_custom_allowed(rewards: list[dict], allowed: bool) -> None:
    """Refuse (ValueError) custom rewards when the operator has not allowed them (GRPO_ALLOW_CUSTOM_REWARDS), and a
    package reward that no installed package declares. Files' places are app.core.paths' to check."""
    for r in rewards:
        name = r["name"]
        if name in BUILTINS:
            continue
        if not allowed:
            raise ValueError(
                f"{name!r} is a custom reward function, which runs user code on the workers: custom "
                f"rewards are off. The operator turns them on with {SWITCH}=1 on the dashboard and the "
                "workers"
            )
        packages = declared()
        if file_reference(name) is None and name not in packages and name not in packages.values():
            raise ValueError(
                f"{name!r} is not declared by any installed package (entry point group "
                f"{ENTRY_POINT_GROUP}); or give a file: '/path/file.py:function'"
            )


_FILE_CACHE: dict[tuple[str, int], Any] = {}  # (path, modification time) -> the loaded module


def _load_file(path: str, function: str) -> Callable:
    """``function`` of the Python file ``path`` (loaded once per version of the file)."""
    resolved = Path(path).expanduser().resolve()
    key = (str(resolved), resolved.stat().st_mtime_ns)
    if key not in _FILE_CACHE:
        spec = importlib.util.spec_from_file_location(f"grpo_reward_{abs(hash(key))}", resolved)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _FILE_CACHE[key] = module
    return getattr(_FILE_CACHE[key], function)


def load_reward(name: str) -> Callable:
    """The function a reward name stands for: a built-in, a function in a file, or an entry point (by its name or
    its value); a ValueError when it cannot be loaded or is not callable."""
    if name in BUILTINS:
        return BUILTINS[name]
    try:
        where = file_reference(name)
        if where is not None:
            fn = _load_file(*where)
        else:
            eps = [ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if name in (ep.name, ep.value)]
            if not eps:
                raise ValueError(f"not declared in the entry point group {ENTRY_POINT_GROUP}")
            fn = eps[0].load()
    except Exception as e:  # noqa: BLE001 (the user's module may raise anything while it loads)
        raise ValueError(f"reward {name!r} could not be loaded: {type(e).__name__}: {e}") from e
    if not callable(fn):
        raise ValueError(f"reward {name!r} is not a function")
    return fn


# ---- scoring outputs --------------------------------------------------------------------------------


class RewardFunctionError(RuntimeError):
    """A reward function failed on an output; the message (one line) names the function and quotes the output."""


def _quote(text: Any) -> str:
    """``text`` cut to SHOWN_CHARS characters, quoted on one line (repr)."""
    text = str(text)
    return repr(text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "...")


def _finite(value: Any) -> bool:
    return isinstance(value, numbers.Real) and math.isfinite(value)


def call_reward(
    name: str, fn: Callable, question: str, completion: str, reference: str, *, row: dict, steps: int | None = None
) -> float | list[float]:
    """``fn(question, completion, reference, **row)`` checked: a finite number, or with ``steps`` (process
    supervision) a list of that many finite numbers. Anything else, or an exception, raises RewardFunctionError
    naming ``name`` and quoting the question and the completion."""
    where = f"on question {_quote(question)} with completion {_quote(completion)}"
    try:
        value = fn(question, completion, reference, **row)
    except Exception as e:  # noqa: BLE001 (user code may raise anything)
        raise RewardFunctionError(
            f"reward {name!r} raised {type(e).__name__}: {' '.join(str(e).split())[:SHOWN_CHARS]} {where}"
        ) from e
    if steps is None:
        if not _finite(value):
            raise RewardFunctionError(
                f"reward {name!r} returned {_quote(value)} ({type(value).__name__}), not a finite number, {where}"
            )
        return float(value)
    if not isinstance(value, (list, tuple)) or not all(_finite(v) for v in value):
        raise RewardFunctionError(
            f"reward {name!r} returned {_quote(value)}, not a list of finite numbers (one per step), {where}"
        )
    if len(value) != steps:
        raise RewardFunctionError(
            f"reward {name!r} returned {len(value)} step rewards for an output of {steps} steps, {where}"
        )
    return [float(v) for v in value]


def score_outputs(
    rewards: list[dict], outputs: list[dict], process: bool = False
) -> list[tuple[float | list[float], dict[str, float]]]:
    """Each output's weighted reward and its components (each reward's own value, by name). ``outputs``: dicts
    ``{question, completion, reference, row}``, ``row`` the keyword arguments (with ``process``: ``steps``).

    Outcome: r = sum_k w_k f_k(output); process: r_j = sum_k w_k f_k(output)[j] for each step j, and a component
    is the mean of its step values. Worked: accuracy 1.0 x weight 1 + length 0.9268 x weight 0.5 = 1.4634.

    >>> out = {"question": "q", "completion": "#### 14", "reference": "14",
    ...        "row": {"completion_tokens": 8, "max_new_tokens": 32}}
    >>> total, parts = score_outputs(({"name": "accuracy", "weight": 1.0}, {"name": "length", "weight": 0.5}), [out])[0]
    >>> round(total, 4), {k: round(v, 4) for k, v in parts.items()}
    (1.4634, {'accuracy': 1.0, 'length': 0.9268})
    """
    fns = [(r["name"], r["weight"], load_reward(r["name"])) for r in rewards]
    results = []
    for out in outputs:
        steps = len(out["row"]["steps"]) if process else None
        total: Any = [0.0] * steps if process else 0.0
        components: dict[str, float] = {}
        for name, weight, fn in fns:
            value = call_reward(
                name, fn, out["question"], out["completion"], out["reference"], row=out["row"], steps=steps
            )
            if process:
                total = [t + weight * v for t, v in zip(total, value, strict=True)]
                components[name] = sum(value) / len(value) if value else 0.0
            else:
                total += weight * value
                components[name] = value
        results.append((total, components))
    return results


def named_rewards(spec: Any, judged: Any, rows: list[dict], lengths: list[int]) -> tuple[list, list]:
    """The run's ``rewards`` on N judged outputs (step.Judged; ``rows[i]`` output i's dataset row, ``lengths[i]`` its
    tokens, end token included): (judged.outcome with each output's weighted reward as its reward and the named
    components beside the verifier's, the step rewards: each step's weighted sum with process supervision, else
    judged.verdicts as they were)."""
    process = spec.supervision == "process"
    outputs = []
    for i, row in enumerate(rows):
        extra = {k: v for k, v in row.items() if k not in ("question", "answer")}
        extra.update(
            correct=judged.outcome[i][1]["correct"],
            answer_match=spec.answer_match,
            completion_tokens=lengths[i],
            max_new_tokens=spec.max_new_tokens,
        )
        if process:
            extra["steps"] = judged.steps[i]
        outputs.append(
            {"question": row["question"], "completion": judged.texts[i], "reference": row["answer"], "row": extra}
        )
    scored = score_outputs(spec.rewards, outputs, process)
    outcome = [
        (r if process else total, {**comps, **named})
        for (r, comps), (total, named) in zip(judged.outcome, scored, strict=True)
    ]
    return outcome, [total for total, _ in scored] if process else judged.verdicts


def reward_means(components: list[dict[str, float]], rewards: list[dict]) -> dict[str, float]:
    """The metrics ``reward/<name>``: each named reward's mean over the step's outputs (its unweighted value).

    >>> reward_means([{"length": 0.5}, {"length": 1.0}], ({"name": "length", "weight": 2.0},))
    {'reward/length': 0.75}
    """
    if not components:
        return {}
    return {f"reward/{r['name']}": sum(c[r["name"]] for c in components) / len(components) for r in rewards}
