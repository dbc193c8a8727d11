"""The Run tab's evaluations: the Pass@K / Maj@K view (app.web.views.eval_curves) on hand-made metric rows, and the
tab's listeners (app.web.tabs.run_eval) over a real SQLite store as evaluations arrive: shown for a run that
evaluated, the chart only for one that sampled, the first and the latest evaluation by default, the user's picks
kept, the later one following the newest evaluation while it showed the newest; the questions that flipped between
the picks, filtered by flip and by text."""

from __future__ import annotations

import json

from app import store
from app.store.db import session_scope
from app.web.tabs.run_eval import _other_run, _redraw, _show
from app.web.views.eval_curves import NO_CURVES, curve, curves_figure, default_pair, evaluation_row, evaluations
from grpo_engine.report.recorder import EvalOutput, EvalQuestion
from tests.support.store import new_run


def evaluation(step: int, passes: list[float], majs: list[float], ks=(1, 2, 4)) -> dict:
    row = {"step": step, "eval/accuracy": passes[0]}
    row |= {f"eval/pass@{k}": v for k, v in zip(ks, passes, strict=True)}
    return row | {f"eval/maj@{k}": v for k, v in zip(ks, majs, strict=True)}


ROWS = [
    evaluation(0, [0.2, 0.35, 0.5], [0.2, 0.2, 0.25]),
    {"step": 1, "loss": 0.1},
    evaluation(2, [0.3, 0.42, 0.52], [0.3, 0.3, 0.45]),
]


def test_the_view_reads_the_evaluations_and_their_curves():
    assert evaluations(ROWS) == [0, 2] and default_pair([0, 2, 4]) == (0, 4)
    assert curve(ROWS[2], "eval/maj@") == ([1, 2, 4], [0.3, 0.3, 0.45])
    fig = curves_figure([("step 0", evaluation_row(ROWS, 0)), ("step 2", evaluation_row(ROWS, 2))])
    assert [t.name for t in fig.data] == ["Pass@K, step 0", "Maj@K, step 0", "Pass@K, step 2", "Maj@K, step 2"]
    assert list(fig.data[3].y) == [0.3, 0.3, 0.45] and fig.data[1].line.dash == "dash"
    assert fig.layout.xaxis.type == "log" and list(fig.layout.xaxis.tickvals) == [1, 2, 4]
    assert tuple(fig.layout.yaxis.range) == (0, 1.02)  # shares on a fixed axis
    other_run = curves_figure([("step 2", ROWS[2]), ("run 7, step 0", None)])  # a row None draws nothing
    assert [t.name for t in other_run.data] == ["Pass@K, step 2", "Maj@K, step 2"]
    assert evaluation_row(ROWS, 1) is None  # step 1 did not evaluate
    empty = curves_figure([("step 1", None)])
    assert not empty.data and empty.layout.annotations[0].text == NO_CURVES


def record(url: str, run_id: int, row: dict) -> None:
    with session_scope(url) as s:
        store.record_step(s, run_id, row["step"], 1, {k: v for k, v in row.items() if k != "step"})


def choices(dropdown) -> list:
    return [value for _, value in dropdown.choices]


def traces(plot) -> list[str]:
    """The names of a gr.Plot update's traces (its figure travels as plotly JSON)."""
    return [t.get("name") for t in json.loads(plot.value["plot"])["data"]]


def show(run_id, seen, first, second, flip="changed", text="", other=None):
    """_show's outputs but the run picker's: (box, first, second, plot, flips, seen)."""
    box, first, _, second, plot, flips, seen = _show(run_id, other, first, second, flip, text, seen)
    return box, first, second, plot, flips, seen


def test_the_tab_shows_first_and_latest_keeps_picks_and_follows_the_newest(sqlite_url, monkeypatch):
    monkeypatch.setenv("GRPO_DATABASE_URL", sqlite_url)
    untouched = new_run(sqlite_url)
    box, *_ = show(untouched, None, None, None)
    assert box.visible is False  # no evaluation yet: nothing to compare
    plain = new_run(sqlite_url)
    record(sqlite_url, plain, {"step": 0, "eval/accuracy": 0.1})
    box, first, _, plot, flips, _ = show(plain, None, None, None)
    assert box.visible and first.value == 0 and plot.visible is False  # greedy only: no Pass@K chart
    assert "recorded no evaluation&#x27;s questions" in flips  # a run whose questions were not kept says so

    run_id = new_run(sqlite_url, eval_samples=4)
    record(sqlite_url, run_id, ROWS[0])
    box, first, second, plot, _, seen = show(run_id, None, None, None)
    assert box.visible and (first.value, choices(first)) == (0, [0]) and second.value is None
    assert plot.visible and len(traces(plot)) == 2
    record(sqlite_url, run_id, ROWS[2])
    box, first, second, plot, _, seen = show(run_id, seen, 0, None)
    assert first.value == 0 and second.value == 2 and seen == [run_id, [0, 2]] and len(traces(plot)) == 4
    skipped = _show(run_id, run_id, 0, 2, "changed", "", seen)  # nothing new: every output skipped
    assert all(update == {"__type__": "update"} for update in skipped), skipped

    record(sqlite_url, run_id, evaluation(4, [0.4, 0.5, 0.6], [0.4, 0.45, 0.5]))
    _, first, second, _, _, seen = show(run_id, seen, 0, 2)  # the later pick showed the newest: it follows
    assert (first.value, second.value) == (0, 4)
    record(sqlite_url, run_id, evaluation(6, [0.4, 0.5, 0.6], [0.4, 0.45, 0.5]))
    _, first, second, _, _, seen = show(run_id, seen, 2, 2)  # the user picked older evaluations: kept
    assert (first.value, second.value) == (2, 2) and choices(second) == [0, 2, 4, 6]
    plot, _ = _redraw(run_id, run_id, 4, 6, "changed", "")
    assert traces(plot)[::2] == ["Pass@K, step 4", "Pass@K, step 6"]


def test_the_flips_view_lists_what_changed_between_the_picks(sqlite_url, monkeypatch):
    monkeypatch.setenv("GRPO_DATABASE_URL", sqlite_url)
    run_id = new_run(sqlite_url)
    right = EvalOutput("4 + 4 = 8\n#### 8", "8", "gsm8k", True, True)
    wrong = EvalOutput("4 + 4 = 9", "9", "number", False, False)
    with session_scope(sqlite_url) as s:
        for step, outputs in ((0, (wrong, right)), (5, (right, right))):
            store.record_evaluation(
                s,
                run_id,
                step,
                [EvalQuestion(i, f"Q{i}: 4 + 4?", "8", o, [right, wrong]).to_dict() for i, o in enumerate(outputs)],
            )
            store.record_step(s, run_id, step, 1, {"eval/accuracy": 0.5})
    *_, flips, _ = show(run_id, None, None, None)
    assert 'data-flip="gained"' in flips and "Q0: 4 + 4?" in flips and "Q1" not in flips  # changed only
    assert "<b>wrong → right 1</b>" in flips and "right both times 1" in flips
    assert "9 ✗ → 8 ✓" in flips and "1 of 2 sampled right: 8 ✓ · 9 ✗" in flips and "(strict ####)" in flips
    _, unchanged = _redraw(run_id, run_id, 0, 5, "unchanged", "")
    assert "Q1: 4 + 4?" in unchanged and "Q0" not in unchanged
    _, none = _redraw(run_id, None, 0, 5, "all", "no such text")
    assert "No question of this kind" in none


def test_an_evaluation_compares_with_another_runs_on_the_same_questions(sqlite_url, monkeypatch):
    """The run picker lists the shown run first, then the others that kept an evaluation's questions; picking one
    lists its evaluations (its latest picked), draws both runs' curves and lists the flips between them; a new
    evaluation of the shown run leaves that pick alone."""
    monkeypatch.setenv("GRPO_DATABASE_URL", sqlite_url)
    right = EvalOutput("4 + 4 = 8\n#### 8", "8", "gsm8k", True, True)
    wrong = EvalOutput("4 + 4 = 9", "9", "number", False, False)
    baseline, trained = new_run(sqlite_url, eval_samples=4), new_run(sqlite_url, eval_samples=4)
    with session_scope(sqlite_url) as s:
        for run_id, step, outputs in (
            (baseline, 0, (wrong, wrong)),
            (trained, 0, (wrong, right)),
            (trained, 3, (right, right)),
        ):
            questions = [EvalQuestion(i, f"Q{i}: 4 + 4?", "8", o, [o]).to_dict() for i, o in enumerate(outputs)]
            store.record_evaluation(s, run_id, step, questions)
    for run_id, row in ((baseline, ROWS[0]), (trained, ROWS[0]), (trained, {**ROWS[2], "step": 3})):
        record(sqlite_url, run_id, row)
    box, first, runs, second, plot, flips, seen = _show(trained, None, None, None, "changed", "", None)
    assert runs.value == trained and choices(runs) == [trained, baseline] and runs.choices[0][0] == "this run"
    assert (first.value, second.value) == (0, 3) and "<b>wrong → right 1</b>" in flips
    second, plot, flips = _other_run(trained, baseline, 3, 3, "changed", "")  # step 3 of this run against the baseline
    assert (second.value, choices(second)) == (0, [0])
    assert traces(plot)[::2] == ["Pass@K, step 3", f"Pass@K, run {baseline}, step 0"]
    assert "<b>right → wrong 2</b>" in flips  # the trained run's 2 right answers, the baseline's 2 wrong ones
    record(sqlite_url, trained, {**ROWS[2], "step": 6})
    with session_scope(sqlite_url) as s:
        store.record_evaluation(s, trained, 6, [EvalQuestion(0, "Q0: 4 + 4?", "8", right, []).to_dict()])
    _, first, runs, second, _, flips, seen = _show(trained, baseline, 3, 0, "changed", "", seen)
    assert first.value == 3 and runs == second == {"__type__": "update"}  # the other run's pick stays
    assert "<b>right → wrong 2</b>" in flips
    second, *_ = _other_run(trained, trained, 3, 0, "changed", "")  # this run again: its first and latest
    assert second.value == 6
