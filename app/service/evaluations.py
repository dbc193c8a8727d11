"""A run's evaluations question by question, and two evaluations compared: which held-out questions an evaluation
got right, which of them flipped between two evaluations (of one run, or of two runs on the same held-out
questions), with both outputs and each sampled output's answer.

``/list_eval_results`` and ``/compare_evals`` call these; the Run tab's evaluation view reads the same.
"""

from __future__ import annotations

from app import store
from app.service.api import ApiError, require_run
from app.store.db import session_scope

FLIPS = ("changed", "gained", "lost", "unchanged", "all")  # which compared questions a comparison lists
MAX_ROWS = 1000  # questions one comparison lists at most (the count says how many matched)


def _evaluation(s, run_id: int, step: int | None) -> tuple[int, list[dict]]:
    """(step, questions) of ``run_id``'s evaluation at ``step`` (None: its latest); ApiError naming the steps it has."""
    require_run(s, run_id)
    steps = store.eval_steps(s, run_id)
    if not steps:
        raise ApiError(
            f"run {run_id} recorded no evaluation's questions (eval_every 0, or a run from before they were kept)"
        )
    if step is None:
        step = steps[-1]
    if step not in steps:
        raise ApiError(f"run {run_id} has no evaluation at step {step}; its evaluations: {', '.join(map(str, steps))}")
    return step, store.eval_results(s, run_id, step)


def list_eval_results(run_id: int, step: int | None = None) -> dict:
    """One evaluation's questions: ``{run_id, step, steps, questions}``, ``steps`` every evaluation the run recorded,
    ``questions`` in held-out order, each ``{index, question, reference, greedy, samples}`` (an output: completion,
    answer, answer_rule, correct, formatted). ``step`` None: the latest evaluation."""
    with session_scope() as s:
        step, questions = _evaluation(s, int(run_id), None if step is None else int(step))
        steps = store.eval_steps(s, int(run_id))
    return {"run_id": int(run_id), "step": step, "steps": steps, "questions": questions}


def evaluated_runs() -> list[dict]:
    """The runs whose evaluations a comparison can read, newest first: ``{run_id, name}`` each."""
    with session_scope() as s:
        ids = store.evaluated_runs(s)
        names = {r["run_id"]: r["name"] for r in store.list_runs(s)}
    return [{"run_id": i, "name": names[i]} for i in ids if i in names]


def flip_of(first: bool, second: bool) -> str:
    """How a question's greedy verdict moved between two evaluations.

    >>> flip_of(False, True), flip_of(True, False), flip_of(True, True), flip_of(False, False)
    ('gained', 'lost', 'right both', 'wrong both')
    """
    if first == second:
        return "right both" if first else "wrong both"
    return "gained" if second else "lost"


def _wanted(flip: str, kind: str) -> bool:
    return (
        flip == "all"
        or (flip == "changed" and kind in ("gained", "lost"))
        or (flip == "unchanged" and kind in ("right both", "wrong both"))
        or flip == kind
    )


def compare_evals(
    run_id: int,
    step: int | None = None,
    *,
    other_run_id: int | None = None,
    other_step: int | None = None,
    flip: str = "changed",
    text: str = "",
) -> dict:
    """Two evaluations compared question by question: ``run_id`` at ``step`` (None: its first) against
    ``other_run_id`` (None: the same run) at ``other_step`` (None: its latest), the questions matched by their text.
    Returns ``{first: {run_id, step}, second: {...}, counts: {gained, lost, right both, wrong both, only first,
    only second}, rows}``: ``rows`` the matched questions whose flip is ``flip`` (FLIPS: 'changed' = gained or lost)
    and whose question or greedy outputs hold ``text`` (any case), each ``{index, question, reference, flip, first,
    second}`` with both evaluations' greedy output and samples, at most MAX_ROWS."""
    if flip not in FLIPS:
        raise ApiError(f"flip must be one of {', '.join(FLIPS)}, got {flip!r}")
    other = int(run_id if other_run_id is None else other_run_id)
    with session_scope() as s:
        first_steps = store.eval_steps(s, int(run_id))
        a_step, a = _evaluation(
            s, int(run_id), (first_steps[0] if first_steps else None) if step is None else int(step)
        )
        b_step, b = _evaluation(s, other, None if other_step is None else int(other_step))
    later = {q["question"]: q for q in b}
    counts = dict.fromkeys(("gained", "lost", "right both", "wrong both", "only first", "only second"), 0)
    counts["only second"] = len(later.keys() - {q["question"] for q in a})
    rows, needle = [], text.strip().lower()
    for q in a:
        match = later.get(q["question"])
        if match is None:
            counts["only first"] += 1
            continue
        kind = flip_of(q["greedy"]["correct"], match["greedy"]["correct"])
        counts[kind] += 1
        words = f"{q['question']}\n{q['greedy']['completion']}\n{match['greedy']['completion']}".lower()
        if _wanted(flip, kind) and needle in words and len(rows) < MAX_ROWS:
            rows.append(
                {
                    "index": q["index"],
                    "question": q["question"],
                    "reference": q["reference"],
                    "flip": kind,
                    "first": {"greedy": q["greedy"], "samples": q["samples"]},
                    "second": {"greedy": match["greedy"], "samples": match["samples"]},
                }
            )
    first, second = {"run_id": int(run_id), "step": a_step}, {"run_id": other, "step": b_step}
    return {"first": first, "second": second, "counts": counts, "rows": rows}
