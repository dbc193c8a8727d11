"""The Run tab's sampled-evaluation chart: the view (app.web.views.eval_curves) on hand-made metric rows, and the tab's
listener (app.web.tabs.run_eval) over a real SQLite store as evaluations arrive: shown only for a run that records
pass@k, the first and the latest evaluation by default, the user's picks kept, the later one following the newest
evaluation while it showed the newest."""

from __future__ import annotations

from app import store
from app.store.db import session_scope
from app.web.tabs.run_eval import _redraw, _show
from app.web.views.eval_curves import NO_CURVES, curve, curves_figure, default_pair, evaluations
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
    fig = curves_figure(ROWS, 0, 2)
    assert [t.name for t in fig.data] == ["Pass@K, step 0", "Maj@K, step 0", "Pass@K, step 2", "Maj@K, step 2"]
    assert list(fig.data[3].y) == [0.3, 0.3, 0.45] and fig.data[1].line.dash == "dash"
    assert fig.layout.xaxis.type == "log" and list(fig.layout.xaxis.tickvals) == [1, 2, 4]
    assert tuple(fig.layout.yaxis.range) == (0, 1.02)  # shares on a fixed axis
    assert [t.name for t in curves_figure(ROWS, 2, None).data] == ["Pass@K, step 2", "Maj@K, step 2"]
    empty = curves_figure([{"step": 1, "loss": 0.1}], None, None)
    assert not empty.data and empty.layout.annotations[0].text == NO_CURVES


def record(url: str, run_id: int, row: dict) -> None:
    with session_scope(url) as s:
        store.record_step(s, run_id, row["step"], 1, {k: v for k, v in row.items() if k != "step"})


def choices(dropdown) -> list:
    return [value for _, value in dropdown.choices]


def test_the_tab_shows_first_and_latest_keeps_picks_and_follows_the_newest(sqlite_url, monkeypatch):
    monkeypatch.setenv("GRPO_DATABASE_URL", sqlite_url)
    plain = new_run(sqlite_url)
    record(sqlite_url, plain, {"step": 0, "eval/accuracy": 0.1})
    box, *_ = _show(plain, None, None, None)
    assert box.visible is False  # no sampled evaluation: no chart

    run_id = new_run(sqlite_url, eval_samples=4)
    record(sqlite_url, run_id, ROWS[0])
    box, first, second, fig, seen = _show(run_id, None, None, None)
    assert box.visible and (first.value, choices(first)) == (0, [0]) and second.value is None and len(fig.data) == 2
    record(sqlite_url, run_id, ROWS[2])
    box, first, second, fig, seen = _show(run_id, seen, 0, None)
    assert first.value == 0 and second.value == 2 and seen == [run_id, [0, 2]] and len(fig.data) == 4
    skipped = _show(run_id, seen, 0, 2)  # nothing new: every output skipped
    assert all(update == {"__type__": "update"} for update in skipped), skipped

    record(sqlite_url, run_id, evaluation(4, [0.4, 0.5, 0.6], [0.4, 0.45, 0.5]))
    _, first, second, _, seen = _show(run_id, seen, 0, 2)  # the later pick showed the newest: it follows
    assert (first.value, second.value) == (0, 4)
    record(sqlite_url, run_id, evaluation(6, [0.4, 0.5, 0.6], [0.4, 0.45, 0.5]))
    _, first, second, _, seen = _show(run_id, seen, 2, 2)  # the user picked older evaluations: kept
    assert (first.value, second.value) == (2, 2) and choices(second) == [0, 2, 4, 6]
    assert [t.name for t in _redraw(run_id, 4, 6).data][::2] == ["Pass@K, step 4", "Pass@K, step 6"]
