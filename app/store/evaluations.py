"""A run's evaluations, question by question: every held-out question's greedy output and sampled outputs at each
evaluation (the ``eval_results`` table), as the worker records them with the evaluation's metrics.

A resumed run evaluates a step again: its rows replace the earlier attempt's (``truncate_after`` also drops them).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, insert, select
from sqlalchemy.orm import Session

from app.store.models import EvalResult

# an output's fields, as recorded (tokens: each token's text in context, then the end token's; null before they were)
OUTPUT_FIELDS = ("completion", "answer", "answer_rule", "correct", "formatted", "tokens")


def record_evaluation(s: Session, run_id: int, step: int, questions: list[dict[str, Any]]) -> None:
    """Store the evaluation of ``step``: ``questions`` as EvalQuestion.to_dict gives them (index, question,
    reference, greedy, samples), replacing what an earlier attempt stored for that step."""
    s.execute(delete(EvalResult).where(EvalResult.run_id == run_id, EvalResult.step == step))
    if not questions:
        return
    rows = [
        {
            "run_id": run_id,
            "step": step,
            "question_index": q["index"],
            "question": q["question"],
            "reference": q["reference"],
            **{name: q["greedy"].get(name) for name in OUTPUT_FIELDS},
            "samples": [{name: o.get(name) for name in OUTPUT_FIELDS} for o in q["samples"]] or None,
        }
        for q in questions
    ]
    s.execute(insert(EvalResult), rows)


def evaluated_runs(s: Session) -> list[int]:
    """The runs that recorded an evaluation's questions, newest first."""
    return list(s.scalars(select(EvalResult.run_id).distinct().order_by(EvalResult.run_id.desc())))


def eval_steps(s: Session, run_id: int) -> list[int]:
    """The steps at which ``run_id`` recorded an evaluation's questions, in order."""
    return list(
        s.scalars(select(EvalResult.step).where(EvalResult.run_id == run_id).distinct().order_by(EvalResult.step))
    )


def eval_results(s: Session, run_id: int, step: int) -> list[dict[str, Any]]:
    """The questions of ``run_id``'s evaluation at ``step``, in held-out order: ``{index, question, reference,
    greedy: {completion, answer, answer_rule, correct, formatted, tokens}, samples: [the same, ...]}`` (``tokens``
    None for outputs recorded before they were kept)."""
    rows = s.scalars(
        select(EvalResult)
        .where(EvalResult.run_id == run_id, EvalResult.step == step)
        .order_by(EvalResult.question_index)
    )
    return [
        {
            "index": row.question_index,
            "question": row.question,
            "reference": row.reference,
            "greedy": {name: getattr(row, name) for name in OUTPUT_FIELDS},
            "samples": [{"tokens": None, **o} for o in row.samples or []],
        }
        for row in rows
    ]


EVAL_EXPORT_COLUMNS = (
    "run_id",
    "step",
    "question_index",
    "question",
    "reference",
    "output",  # "greedy", or "sample <i>" (0-based) for the i-th sampled output
    *OUTPUT_FIELDS,
)


def iter_eval_rows(s: Session, run_id: int):
    """Every output of every evaluation of ``run_id``, one flat dict each (the keys of EVAL_EXPORT_COLUMNS): by
    step and question, the greedy output first, then the sampled ones in order. Reads one evaluation at a time."""
    for step in eval_steps(s, run_id):
        for q in eval_results(s, run_id, step):
            head = {"run_id": run_id, "step": step, "question_index": q["index"]}
            head.update(question=q["question"], reference=q["reference"])
            outputs = [("greedy", q["greedy"])] + [(f"sample {i}", o) for i, o in enumerate(q["samples"])]
            for label, output in outputs:
                yield {**head, "output": label, **{name: output.get(name) for name in OUTPUT_FIELDS}}
        s.expunge_all()  # keep the session small
