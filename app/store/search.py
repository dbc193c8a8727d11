"""Finding samples across a run, and following one question through time: small functions taking a Session,
returning plain JSON-able dicts.

``search_samples`` filters a run's samples on the columns recorded for that (reward, verdicts, length, step,
the group's spread and kind) and pages through them; ``question_history`` gathers every group sampled for one
question, in this run and in other runs on the same dataset. Both filter on indexed columns: a run's samples by
``samples.run_id`` first (the (run_id, ...) indexes), or, when a filter is on their groups, the run's groups by
``groups.run_id`` and their samples by ``samples.group_id`` (a plan that stays fast when the planner misjudges
how many rows a run has, as PostgreSQL does before its tables are analysed); one question's groups by
``groups.question_key``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from app.store.groups import question_key
from app.store.models import Group, Run, Sample

OUTCOMES = ("any", "correct", "wrong", "no_answer", "truncated")  # what search_samples' ``outcome`` takes
KINDS = ("any", "all_right", "all_wrong", "mixed", "zero_spread")  # what its ``kind`` takes
SORTS = ("step", "reward", "length", "spread")  # what its ``sort`` takes
MAX_PAGE_SIZE = 200
ZERO_SPREAD = 1e-9  # a group whose reward std is at most this taught nothing through its rewards
SHOWN_CHARS = 300  # a completion is cut to this many characters in a result ("…" marks the cut)


def shorten(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text`` cut to ``limit`` characters, "…" ending a cut one.

    >>> shorten("abcdef", 4), shorten("abc", 4)
    ('abcd…', 'abc')
    """
    return text if len(text) <= limit else text[:limit] + "…"


def _shown_completion():
    """The completion column cut in the database to one character more than is shown (enough to tell a cut one),
    so long completions do not travel whole."""
    return func.substr(Sample.completion, 1, SHOWN_CHARS + 1).label("completion")


# ---- samples across a run -------------------------------------------------------------------


def _outcome_filter(outcome: str) -> list:
    """The WHERE terms of an ``outcome``: correct, wrong (an answer found, but wrong), no_answer, truncated. An answer
    is found when the verifier read one under the run's answer_match (samples.answer_found)."""
    return {
        "any": [],
        "correct": [Sample.correct.is_(True)],
        "wrong": [Sample.answer_found.is_(True), Sample.correct.is_(False)],
        "no_answer": [Sample.answer_found.is_(False)],
        "truncated": [Sample.truncated.is_(True)],
    }[outcome]


def _kind_filter(kind: str) -> list:
    """The WHERE terms on the group of a ``kind``: its verifier's verdicts, or zero reward spread."""
    if kind == "any":
        return []
    if kind == "zero_spread":
        return [Group.reward_std <= ZERO_SPREAD]
    return [Group.kind == kind]


def _between(column, low, high) -> list:
    """``low <= column <= high``, a None bound left out."""
    return ([column >= low] if low is not None else []) + ([column <= high] if high is not None else [])


def _check_choice(what: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{what} must be one of {', '.join(choices)}, got {value!r}")


@dataclass(frozen=True)
class SampleQuery:
    """What Find samples asks of a run: the one list of its filters, its order and its page, by the names
    ``/search_samples`` and the Groups tab send (app.service.diagnose_api parses a request into one).

    Bounds (``<name>_min``, ``<name>_max``) are inclusive, None leaves one out: the sample's reward, its group's reward spread (std), its
    length in tokens (the end token included) and its step. ``outcome``: OUTCOMES; ``kind``: the group's, KINDS;
    ``contains``: a case-insensitive substring of the completion (``%``, ``_`` and ``\\`` match themselves);
    ``sort``: SORTS, then by sample id; ``page`` from 1, ``page_size`` 1 to MAX_PAGE_SIZE (ValueError otherwise).
    """

    reward_min: float | None = None
    reward_max: float | None = None
    outcome: str = "any"
    spread_min: float | None = None
    spread_max: float | None = None
    length_min: int | None = None
    length_max: int | None = None
    step_min: int | None = None
    step_max: int | None = None
    contains: str = ""
    kind: str = "any"
    sort: str = "step"
    descending: bool = False
    page: int = 1
    page_size: int = 50

    def __post_init__(self) -> None:
        _check_choice("outcome", self.outcome, OUTCOMES)
        _check_choice("kind", self.kind, KINDS)
        _check_choice("sort", self.sort, SORTS)
        if self.page < 1 or not 1 <= self.page_size <= MAX_PAGE_SIZE:
            raise ValueError(f"page must be at least 1 and page_size from 1 to {MAX_PAGE_SIZE}")


def search_samples(s: Session, run_id: int, query: SampleQuery = SampleQuery()) -> dict[str, Any]:
    """One page of a run's samples that pass every filter of ``query``, in its order. ``total`` counts every
    match; ``pages`` is at least 1; a page past the last has no rows. Each row's completion is cut to SHOWN_CHARS
    characters."""
    on_sample = [
        *_outcome_filter(query.outcome),
        *_between(Sample.reward, query.reward_min, query.reward_max),
        *_between(Sample.length, query.length_min, query.length_max),
        *_between(Sample.step, query.step_min, query.step_max),
    ]
    if query.contains:
        on_sample.append(Sample.completion.icontains(query.contains, autoescape=True))
    on_group = [*_kind_filter(query.kind), *_between(Group.reward_std, query.spread_min, query.spread_max)]
    if on_group:  # the run's groups that pass lead; their samples are found through samples.group_id
        where = [Group.run_id == run_id, *_between(Group.step, query.step_min, query.step_max), *on_group, *on_sample]
        matches = select(Sample.id).join(Group, Group.id == Sample.group_id).where(*where)
    else:  # the run's samples alone, through the (run_id, ...) indexes; no join to count them
        where = [Sample.run_id == run_id, *on_sample]
        matches = select(Sample.id).where(*where)
    total = s.scalar(select(func.count()).select_from(matches.subquery()))
    rows = s.execute(_page_select(where, query))
    return {
        "run_id": run_id,
        "total": total,
        "page": query.page,
        "page_size": query.page_size,
        "pages": max(1, math.ceil(total / query.page_size)),
        "rows": [_search_row(r) for r in rows],
    }


def _page_select(where: list, query: SampleQuery) -> Select:
    """The rows of one page: the filtered samples joined with their groups, in order, from the page's offset."""
    key = {"step": Sample.step, "reward": Sample.reward, "length": Sample.length, "spread": Group.reward_std}[
        query.sort
    ]
    order = (key.desc(), Sample.id.desc()) if query.descending else (key, Sample.id)
    return (
        select(
            Sample.id,
            Sample.group_id,
            Sample.step,
            Group.prompt,
            _shown_completion(),
            Sample.reward,
            Sample.correct,
            Sample.answer_found,
            Sample.answer,
            Sample.answer_rule,
            Sample.reward_components,
            Sample.truncated,
            Sample.length,
            Group.reward_std,
            Group.kind,
        )
        .join(Group, Group.id == Sample.group_id)
        .where(*where)
        .order_by(*order)
        .offset((query.page - 1) * query.page_size)
        .limit(query.page_size)
    )


def _search_row(row) -> dict[str, Any]:
    """One result row of search_samples."""
    return {
        "sample_id": row.id,
        "group_id": row.group_id,
        "step": row.step,
        "question": row.prompt,
        "completion": shorten(row.completion),
        "reward": row.reward,
        "correct": row.correct,
        "answer_found": row.answer_found,
        "answer": row.answer,
        "answer_rule": row.answer_rule,
        "reward_components": row.reward_components,
        "truncated": row.truncated,
        "length": row.length,
        "spread": row.reward_std,
        "kind": row.kind,
    }


# ---- one question through time --------------------------------------------------------------


def group_question(s: Session, group_id: int) -> str | None:
    """The question of group ``group_id`` (None when there is no such group)."""
    return s.scalar(select(Group.prompt).where(Group.id == group_id))


def question_history(
    s: Session, run_id: int, question: str, *, other_runs: bool = True, max_runs: int = 10, max_groups: int = 200
) -> dict[str, Any] | None:
    """Every group sampled for ``question`` in run ``run_id``, by step, and (``other_runs``) in up to ``max_runs``
    other runs on the same dataset that sampled it, newest first, archived ones too (marked); None when there is no
    such run.

    Each run keeps its latest ``max_groups`` groups (``groups_total`` counts them all); ``correct_share_first`` and
    ``_last`` are the share of correct samples in the first and last group shown (None without groups). Sample
    completions are cut to SHOWN_CHARS characters (a whole group: store.get_group).
    """
    this = s.execute(select(Run.id, Run.name, Run.status, Run.archived, Run.dataset).where(Run.id == run_id)).first()
    if this is None:
        return None
    key = question_key(question)
    runs = [this]
    if other_runs:
        runs += s.execute(
            select(Run.id, Run.name, Run.status, Run.archived, Run.dataset)
            .where(
                Run.dataset == this.dataset,
                Run.id != run_id,
                Run.id.in_(select(Group.run_id).where(Group.question_key == key)),
            )
            .order_by(Run.id.desc())
            .limit(max_runs)
        ).all()
    groups = _groups_of(s, key, [r.id for r in runs])
    kept = {r.id: groups.get(r.id, [])[-max_groups:] for r in runs}
    samples = _samples_of(s, [g.id for shown in kept.values() for g in shown])
    return {
        "question": question,
        "question_key": key,
        "dataset": this.dataset,
        "runs": [_history_run(r, kept[r.id], len(groups.get(r.id, [])), samples) for r in runs],
    }


def _groups_of(s: Session, key: str, run_ids: list[int]) -> dict[int, list]:
    """The groups of question ``key`` in these runs, by step and position, per run id."""
    per_run: dict[int, list] = {}
    rows = s.execute(
        select(Group.id, Group.run_id, Group.step, Group.reward_mean, Group.reward_std, Group.kind)
        .where(Group.question_key == key, Group.run_id.in_(run_ids))
        .order_by(Group.run_id, Group.step, Group.position)
    )
    for row in rows:
        per_run.setdefault(row.run_id, []).append(row)
    return per_run


def _samples_of(s: Session, group_ids: list[int]) -> dict[int, list[dict[str, Any]]]:
    """The samples of these groups, in one query, by position, per group id."""
    per_group: dict[int, list[dict[str, Any]]] = {}
    if not group_ids:
        return per_group
    rows = s.execute(
        select(
            Sample.id,
            Sample.group_id,
            _shown_completion(),
            Sample.reward,
            Sample.correct,
            Sample.truncated,
            Sample.length,
        )
        .where(Sample.group_id.in_(group_ids))
        .order_by(Sample.group_id, Sample.position)
    )
    for r in rows:
        per_group.setdefault(r.group_id, []).append(
            {
                "sample_id": r.id,
                "completion": shorten(r.completion),
                "reward": r.reward,
                "correct": r.correct,
                "truncated": r.truncated,
                "length": r.length,
            }
        )
    return per_group


def _history_run(run, groups: list, groups_total: int, samples: dict[int, list[dict[str, Any]]]) -> dict[str, Any]:
    """One run of question_history: its groups with their samples, and how right it was first and last."""
    shown = []
    for g in groups:
        own = samples.get(g.id, [])
        shown.append(
            {
                "group_id": g.id,
                "step": g.step,
                "reward_mean": g.reward_mean,
                "reward_std": g.reward_std,
                "kind": g.kind,
                "correct_share": sum(bool(x["correct"]) for x in own) / len(own) if own else None,
                "samples": own,
            }
        )
    return {
        "run_id": run.id,
        "name": run.name,
        "status": run.status,
        "archived": run.archived,
        "groups_total": groups_total,
        "groups": shown,
        "correct_share_first": shown[0]["correct_share"] if shown else None,
        "correct_share_last": shown[-1]["correct_share"] if shown else None,
    }
