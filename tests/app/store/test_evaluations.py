"""A run's evaluations question by question in the store (app.store.evaluations, migration 0011) on SQLite and
PostgreSQL: recorded with the step, read back in held-out order, replaced when a resumed run evaluates a step again,
dropped after a resume point and with the run. And the service's comparison of two evaluations
(app.service.evaluations): flips, filters, questions matched across runs, refusals naming what is there."""

from __future__ import annotations

import pandas as pd
import pytest

from app import store
from app.service import evaluations, exports
from app.service.api import ApiError
from app.store.db import session_scope
from grpo_engine.report.recorder import EvalOutput, EvalQuestion
from tests.support.store import new_run


def out(answer: str | None, correct: bool, text: str = "") -> EvalOutput:
    text = text or f"so it is {answer}"
    return EvalOutput(text, answer, "number" if answer else "none", correct, False, [text[:5], text[5:]])


def question(i: int, right: bool, samples=()) -> dict:
    return EvalQuestion(i, f"question {i}: what is {i}+1?", str(i + 1), out(str(i + 1 if right else i), right),
                        list(samples)).to_dict()  # fmt: skip


def test_an_evaluation_is_recorded_read_replaced_and_dropped(db_url):
    run_id = new_run(db_url)
    sampled = [out("1", True), out(None, False)]
    with session_scope(db_url) as s:
        store.record_evaluation(s, run_id, 0, [question(1, False), question(0, True, sampled)])
        store.record_evaluation(s, run_id, 3, [question(0, False), question(1, True)])
        store.record_step(s, run_id, 3, 1, {"eval/accuracy": 0.5})
    with session_scope(db_url) as s:
        assert store.eval_steps(s, run_id) == [0, 3]
        first = store.eval_results(s, run_id, 0)
        assert [q["index"] for q in first] == [0, 1]  # held-out order, whatever the order recorded
        assert first[0] == {
            "index": 0,
            "question": "question 0: what is 0+1?",
            "reference": "1",
            "greedy": {
                "completion": "so it is 1",
                "answer": "1",
                "answer_rule": "number",
                "correct": True,
                "formatted": False,
                "tokens": ["so it", " is 1"],
            },  # fmt: skip
            "samples": [
                {
                    "completion": "so it is 1",
                    "answer": "1",
                    "answer_rule": "number",
                    "correct": True,
                    "formatted": False,
                    "tokens": ["so it", " is 1"],
                },
                {
                    "completion": "so it is None",
                    "answer": None,
                    "answer_rule": "none",
                    "correct": False,
                    "formatted": False,
                    "tokens": ["so it", " is None"],
                },  # fmt: skip
            ],
        }
        assert first[1]["samples"] == []  # greedy only
        store.record_evaluation(s, run_id, 3, [question(0, True)])  # a resumed run evaluates step 3 again
    with session_scope(db_url) as s:
        assert [q["greedy"]["correct"] for q in store.eval_results(s, run_id, 3)] == [True]
        store.truncate_after(s, run_id, 2)  # a resume from step 2 forgets what came after
    with session_scope(db_url) as s:
        assert store.eval_steps(s, run_id) == [0]
        store.delete_run(s, run_id)
    with session_scope(db_url) as s:
        assert store.eval_steps(s, run_id) == []


@pytest.fixture
def two_runs(sqlite_url, monkeypatch):
    monkeypatch.setenv("GRPO_DATABASE_URL", sqlite_url)
    first, other = new_run(sqlite_url), new_run(sqlite_url)
    with session_scope(sqlite_url) as s:
        # questions 0..5 at step 0: 0, 1, 2 right; at step 10: 1, 2, 3, 4 right (gained 3 and 4, lost 0)
        store.record_evaluation(s, first, 0, [question(i, i < 3) for i in range(6)])
        store.record_evaluation(s, first, 10, [question(i, 1 <= i <= 4) for i in range(6)])
        store.record_evaluation(s, first, 20, [question(i, True) for i in range(6)])
        # another run on the same questions but one (5), and one of its own (9)
        store.record_evaluation(s, other, 0, [question(i, i == 0) for i in (0, 1, 2, 3, 4, 9)])
    return first, other


def test_two_evaluations_compared_count_and_list_the_flips(two_runs):
    first, other = two_runs
    result = evaluations.compare_evals(first, 0, other_run_id=None, other_step=10)
    assert result["first"] == {"run_id": first, "step": 0} and result["second"] == {"run_id": first, "step": 10}
    assert result["counts"] == {"gained": 2, "lost": 1, "right both": 2, "wrong both": 1, "only first": 0,
                                "only second": 0}  # fmt: skip
    assert [(r["index"], r["flip"]) for r in result["rows"]] == [(0, "lost"), (3, "gained"), (4, "gained")]
    row = result["rows"][0]
    assert row["first"]["greedy"]["correct"] and not row["second"]["greedy"]["correct"] and row["reference"] == "1"
    assert [
        r["index"] for r in evaluations.compare_evals(first, 0, other_run_id=None, other_step=10, flip="gained")["rows"]
    ] == [3, 4]
    assert [
        r["index"]
        for r in evaluations.compare_evals(first, 0, other_run_id=None, other_step=10, flip="unchanged")["rows"]
    ] == [1, 2, 5]
    assert len(evaluations.compare_evals(first, 0, other_run_id=None, other_step=10, flip="all")["rows"]) == 6
    assert [
        r["index"]
        for r in evaluations.compare_evals(first, 0, other_run_id=None, other_step=10, flip="all", text="WHAT IS 4+")[
            "rows"
        ]
    ] == [4]
    default = evaluations.compare_evals(first)  # the first evaluation against the latest
    assert (default["first"]["step"], default["second"]["step"], default["counts"]["gained"]) == (0, 20, 3)


def test_evaluations_of_two_runs_are_matched_by_question(two_runs):
    first, other = two_runs
    result = evaluations.compare_evals(other, 0, other_run_id=first, other_step=20, flip="all")
    assert result["counts"] == {"gained": 4, "lost": 0, "right both": 1, "wrong both": 0, "only first": 1,
                                "only second": 1}  # fmt: skip
    listed = evaluations.list_eval_results(first)
    assert (listed["step"], listed["steps"], len(listed["questions"])) == (20, [0, 10, 20], 6)


def test_a_missing_evaluation_or_flip_is_refused_by_name(two_runs, sqlite_url):
    first, other = two_runs
    with pytest.raises(ApiError, match="run .* has no evaluation at step 5; its evaluations: 0, 10, 20"):
        evaluations.compare_evals(first, 5)
    with pytest.raises(ApiError, match="flip must be one of changed, gained, lost, unchanged, all, got 'up'"):
        evaluations.compare_evals(first, 0, other_run_id=None, other_step=10, flip="up")
    with pytest.raises(ApiError, match="run 999 not found"):
        evaluations.list_eval_results(999)
    with pytest.raises(ApiError, match="recorded no evaluation's questions"):
        evaluations.list_eval_results(new_run(sqlite_url))


def test_an_evaluations_export_has_one_row_per_output_in_parquet_and_csv(sqlite_url, monkeypatch):
    monkeypatch.setenv("GRPO_DATABASE_URL", sqlite_url)
    run_id = new_run(sqlite_url)
    with session_scope(sqlite_url) as s:
        store.record_evaluation(
            s, run_id, 5, [question(1, False), question(0, True, [out("1", True), out(None, False)])]
        )
        store.record_evaluation(s, run_id, 0, [question(0, False)])
    parquet = pd.read_parquet(exports.export_run(run_id, "eval-parquet"))
    csv = pd.read_csv(exports.export_run(run_id, "eval-csv"), keep_default_na=False)
    assert list(parquet.columns) == list(store.EVAL_EXPORT_COLUMNS) == list(csv.columns)
    for frame in (parquet, csv):
        # by step, then question; a question's greedy output first, then its samples in order
        assert list(zip(frame["step"], frame["question_index"], frame["output"], strict=True)) == [
            (0, 0, "greedy"), (5, 0, "greedy"), (5, 0, "sample 0"), (5, 0, "sample 1"), (5, 1, "greedy"),
        ]  # fmt: skip
        assert list(frame["correct"]) == [False, True, True, False, False]
        assert list(frame["answer_rule"]) == ["number", "number", "number", "none", "number"]
    assert parquet["answer"].isna().tolist() == [False, False, False, True, False] and csv["answer"].tolist()[3] == ""
    assert exports.export_run(run_id, "eval-csv").endswith(f"run-{run_id}-evaluations.csv")
