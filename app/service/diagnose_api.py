"""Diagnosing a run through the API: find samples across it, follow one question through time.

Plain functions, JSON in and JSON out, raising app.service.api.ApiError with a message that names the bad parameter, as
app.service.api's; app.web.endpoints wraps them for ``gradio_client`` (``/search_samples``, ``/question_history``) and the UI
calls them directly, so the browser and clients get the same checks. Numbers may come as numbers or as their text
(a form's fields); None or "" means "no bound".
"""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any

from app import store
from app.service.api import ApiError, as_id, checked_text, require_run
from app.store.db import session_scope
from app.store.search import KINDS, MAX_PAGE_SIZE, OUTCOMES, SORTS, SampleQuery
from grpo_engine.spec.config import shown

QUESTION_MAX = 100_000  # the longest question text accepted
CONTAINS_MAX = 1_000  # the longest search text accepted


def _unset(value: Any) -> bool:
    """None, or text with nothing but spaces: the parameter was left empty."""
    return value is None or (isinstance(value, str) and not value.strip())


def as_number(value: Any, what: str) -> float | None:
    """A finite number from a number or its text; None when left empty; else ApiError naming ``what``."""
    if _unset(value):
        return None
    number = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str) and len(value) <= 40:
        try:
            number = float(value.strip())
        except ValueError:
            pass
    if number is None or not math.isfinite(number):
        raise ApiError(f"{what} must be a number, got {shown(value)}")
    return number


def as_count(value: Any, what: str) -> int | None:
    """A whole number from 0 (a step, a length) from a number or its text; None when left empty."""
    return None if _unset(value) else as_id(value, what, low=0)


def as_choice(value: Any, what: str, choices: tuple[str, ...], default: str) -> str:
    """One of ``choices``; None or "" is ``default``."""
    if _unset(value):
        return default
    if value not in choices:
        raise ApiError(f"{what} must be one of {', '.join(choices)}, got {shown(value)}")
    return value


def as_flag(value: Any, what: str, default: bool) -> bool:
    """A bool from true / false (or their text, or 1 / 0); None is ``default``."""
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        return value.strip().lower() in ("true", "1")
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ApiError(f"{what} must be true or false, got {shown(value)}")


def _bounds(low: Any, high: Any, name: str, parse) -> tuple:
    """The ``name``_min and ``name``_max bounds parsed; the min may not exceed the max."""
    low, high = parse(low, f"{name}_min"), parse(high, f"{name}_max")
    if low is not None and high is not None and low > high:
        raise ApiError(f"{name}_min must be at most {name}_max, got {low:g} > {high:g}")
    return low, high


BOUND_PARSERS = {"reward": as_number, "spread": as_number, "length": as_count, "step": as_count}  # name_min, name_max
CHOICES = {"outcome": OUTCOMES, "kind": KINDS, "sort": SORTS}
QUERY_KEYS = tuple(f.name for f in fields(SampleQuery))  # what a search request may name, in its order


def search_samples(run_id: Any, **request: Any) -> dict:
    """One page of a run's samples that pass every filter (app.store.search.search_samples): ``request`` holds
    SampleQuery's keys (QUERY_KEYS), each as a value or its text; an unknown key is refused, naming it."""
    run_id = as_id(run_id)
    unknown = sorted(set(request) - set(QUERY_KEYS))
    if unknown:
        raise ApiError(f"{unknown[0]} is not a search filter; the filters are {', '.join(QUERY_KEYS)}")
    defaults = SampleQuery()
    query = {}
    for name, parse in BOUND_PARSERS.items():
        low, high = request.get(f"{name}_min"), request.get(f"{name}_max")
        query[f"{name}_min"], query[f"{name}_max"] = _bounds(low, high, name, parse)
    for name, choices in CHOICES.items():
        query[name] = as_choice(request.get(name), name, choices, getattr(defaults, name))
    contains = request.get("contains")
    query["contains"] = checked_text("" if contains is None else contains, "contains", CONTAINS_MAX)
    query["descending"] = as_flag(request.get("descending"), "descending", defaults.descending)
    page, page_size = request.get("page"), request.get("page_size")
    query["page"] = defaults.page if _unset(page) else as_id(page, "page")
    query["page_size"] = defaults.page_size if _unset(page_size) else as_id(page_size, "page_size")
    if query["page_size"] > MAX_PAGE_SIZE:
        raise ApiError(f"page_size must be an integer from 1 to {MAX_PAGE_SIZE}, got {query['page_size']}")
    with session_scope() as s:
        require_run(s, run_id)
        return store.search_samples(s, run_id, SampleQuery(**query))


def question_history(run_id: Any, question: Any, other_runs: Any = True) -> dict:
    """Every group sampled for ``question`` (its exact text) in run ``run_id`` by step, and with ``other_runs`` in
    up to 10 other runs on the same dataset, newest first (app.store.search.question_history)."""
    run_id = as_id(run_id)
    question = checked_text("" if question is None else question, "question", QUESTION_MAX)
    if not question.strip():
        raise ApiError("question must not be empty")
    other_runs = as_flag(other_runs, "other_runs", True)
    with session_scope() as s:
        require_run(s, run_id)
        return store.question_history(s, run_id, question, other_runs=other_runs)


def question_of_group(group_id: Any) -> str:
    """The question text of group ``group_id`` (what question_history takes), or ApiError when there is none."""
    group_id = as_id(group_id, "group_id")
    with session_scope() as s:
        question = store.group_question(s, group_id)
    if question is None:
        raise ApiError(f"group {group_id} not found")
    return question
