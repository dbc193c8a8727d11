"""The Run tab's and Compare tab's charts (app.web.views.charts) as pure functions of hand-made metric rows: which panels
are drawn, each panel's own legend, the axes, the smoothing, the metrics picked."""

from __future__ import annotations

import pytest

from app.web.views.charts import (
    NO_STEPS,
    PANELS,
    chart_panels,
    compare_figure,
    ema,
    metrics_figure,
    recorded_metrics,
    series_weight,
)
from grpo_engine.report.metrics import EVAL_METRICS, METRIC_REGISTRY


def _rows(n: int = 4, **extra) -> list[dict]:
    """``n`` steps of a rule-reward run's metrics (no reward model), plus ``extra`` on every step."""
    return [
        {
            "step": s,
            "iteration": 1,
            "reward_mean": 0.5 + 0.1 * s,
            "reward_std": 0.4,
            "correct_frac": 0.5 + 0.1 * s,
            "zero_std_frac": 0.25,
            "kl": 0.01 * s,
            "loss": 0.1,
            "clip_frac": 0.0,
            "entropy": 1.0,
            "completion_len": 20.0 + s,
            "truncated_frac": 0.0,
            "grad_norm": 0.5 * s,
            "learning_rate": 2e-4,
            "time/step": 0.3,
            **extra,
        }
        for s in range(1, n + 1)
    ]


def _panel_of(fig) -> dict[str, str]:
    """Each drawn metric -> the title of the panel it is drawn in: the panels' axes are numbered in the order of
    their titles (x, x2, x3, ...)."""
    titles = [a.text for a in fig.layout.annotations]
    return {t.name: titles[int(t.xaxis[1:] or 1) - 1] for t in fig.data if t.showlegend is not False}


def test_ema_on_hand_numbers():
    assert ema([0, 1, 1], 0.5) == [0, 0.5, 0.75]
    assert ema([2.0, 4.0], 0.0) == [2.0, 4.0]  # weight 0: the values
    assert ema([1.0, 1.0, 1.0], 0.9) == [1.0, 1.0, 1.0]
    assert ema([], 0.6) == []
    assert ema([0.0, 10.0], 0.9) == [0.0, pytest.approx(1.0)]  # no debiasing: the first value is the start


def test_no_metrics_is_one_clear_message_and_no_panels():
    fig = metrics_figure([])
    assert [a.text for a in fig.layout.annotations] == [NO_STEPS] and not fig.data
    assert "no steps recorded yet" in NO_STEPS.lower()


def test_only_panels_with_values_are_drawn_and_no_empty_panel_says_no_data():
    fig = metrics_figure(_rows())
    titles = [a.text for a in fig.layout.annotations]
    assert titles == [
        "reward",
        "accuracy",
        "fractions",
        "KL and loss",
        "entropy (nats)",
        "completion length (tokens)",
        "gradient norm",
        "learning rate",
        "timing (s)",
    ]
    assert "reward model" not in titles and "other" not in titles  # a rule-reward run has no reward model panel
    assert not any("no data" in t for t in titles)


def test_the_accuracy_panel_draws_no_line_under_its_twin():
    """eval/accuracy is eval/accuracy_strict or _flexible (the rule answer_match names): drawn beside both, its line
    would lie exactly under one of theirs and its legend entry name a line nobody sees. Picked, it is drawn; and it
    stays in the reward model's panel, beside the reward model's accuracy."""
    evaluation = {"eval/accuracy": 0.25, "eval/accuracy_strict": 0.25, "eval/accuracy_flexible": 0.4}
    rows = [{"step": 0, "iteration": 0, **evaluation, "eval/format": 0.5}, *_rows(2)]
    accuracy = dict(chart_panels(rows))["accuracy"]
    assert "eval/accuracy" not in accuracy and {"eval/accuracy_strict", "eval/accuracy_flexible"} <= set(accuracy)
    assert dict(chart_panels(rows, ["eval/accuracy"]))["accuracy"] == ("eval/accuracy",)
    assert "eval/accuracy" in dict(chart_panels([{"step": 0, "iteration": 0, "eval/accuracy": 0.25}]))["accuracy"]
    with_rm = [*rows, {"step": 3, "iteration": 1, "rm/accuracy_after": 0.8}]
    assert dict(chart_panels(with_rm))["reward model"] == ("rm/accuracy_after", "eval/accuracy")


def test_reward_model_and_other_panels_appear_with_their_metrics():
    rows = _rows(2) + [{"step": 3, "iteration": 1, "rm/loss": 0.4, "rm/accuracy_after": 0.8, "custom/x": 1.0}]
    titles = [title for title, _ in chart_panels(rows)]
    assert titles[-2:] == ["reward model", "other"]
    assert dict(chart_panels(rows))["reward model"] == ("rm/accuracy_after", "rm/loss")
    assert dict(chart_panels(rows))["other"] == ("custom/x",)


def test_registry_metrics_without_a_panel_are_drawn_only_when_picked():
    rows = _rows(2) + [{"step": 3, "iteration": 1, "rm/train_examples": 32.0, "rm/replayed": 0.0}]
    assert "other" not in dict(chart_panels(rows))  # the reward model's table shows them
    assert chart_panels(rows, ["rm/replayed", "kl"]) == [("KL and loss", ("kl",)), ("other", ("rm/replayed",))]
    fig = metrics_figure(rows)
    assert all(fig.layout[a].matches == "x" for a in fig.layout if a.startswith("xaxis") and a != "xaxis")


def test_metrics_that_mislead_together_are_apart():
    panel = _panel_of(metrics_figure(_rows(), smoothing=0.0))
    assert panel["reward_mean"] != panel["correct_frac"]  # equal under a rule reward: one would hide the other
    assert panel["learning_rate"] != panel["grad_norm"]  # 2e-4 would lie flat on a gradient norm's axis
    assert panel["truncated_frac"] != panel["completion_len"]  # a share on a length axis
    assert panel["truncated_frac"] == panel["zero_std_frac"] == panel["clip_frac"] == "fractions"
    assert panel["correct_frac"] == "accuracy"


def test_each_panel_has_its_own_legend_at_its_right():
    fig = metrics_figure(_rows(), smoothing=0.6)
    panels = chart_panels(_rows())
    legends = ["legend"] + [f"legend{i}" for i in range(2, len(panels) + 1)]
    for legend, (title, keys) in zip(legends, panels, strict=True):
        shown = [t for t in fig.data if t.legend == legend and t.showlegend is not False]
        assert [t.name for t in shown] == list(keys), title
        xaxis = fig.layout["xaxis" + shown[0].xaxis[1:]]
        assert fig.layout[legend].x > xaxis.domain[1]  # beside its own panel, not one legend for the figure
        assert fig.layout[legend].y == fig.layout["yaxis" + shown[0].yaxis[1:]].domain[1]


def test_shares_are_on_zero_to_one_and_a_constant_series_around_its_value():
    fig = metrics_figure(_rows())
    by_name = {t.name: t for t in fig.data if t.showlegend is not False}
    for name in ("correct_frac", "truncated_frac"):
        assert tuple(fig.layout["yaxis" + by_name[name].yaxis[1:]].range) == (-0.03, 1.03)
    low, high = fig.layout["yaxis" + by_name["learning_rate"].yaxis[1:]].range
    assert low < 2e-4 < high and high - low < 1e-3  # not plotly's -1 to 1 around a constant
    assert fig.layout["yaxis" + by_name["grad_norm"].yaxis[1:]].range is None  # plotly's own


def test_smoothing_draws_the_ema_bold_over_the_faint_raw_values():
    values = [float(s % 3) for s in range(40)]
    rows = [{"step": s, "iteration": 1, "reward_mean": v} for s, v in enumerate(values, start=1)]
    raw, smooth = metrics_figure(rows, smoothing=0.5).data
    assert list(raw.y) == values and raw.showlegend is False and raw.opacity < 0.5
    assert list(smooth.y) == ema(values, 0.5) and smooth.name == "reward_mean"
    assert smooth.line.width > raw.line.width and raw.legendgroup == smooth.legendgroup
    [plain] = metrics_figure(rows, smoothing=0.0).data  # no smoothing: the values, once
    assert list(plain.y) == values and plain.showlegend is not False


def test_a_short_run_is_smoothed_less_and_ticks_on_whole_steps():
    assert (series_weight(0.6, 10), series_weight(0.6, 20), series_weight(0.6, 100)) == (0.0, 0.5, 0.6)
    ramp = [{"step": s, "iteration": 1, "kl": 3.3e-5 * s} for s in range(1, 11)]
    fig = metrics_figure(ramp, smoothing=0.6)
    [kl] = fig.data  # 10 steps: drawn raw, so the line ends at the last value, not an average lagging behind
    assert kl.y[-1] == pytest.approx(3.3e-4) and kl.name == "kl"
    assert fig.layout.xaxis.dtick == 1  # a tick per step: none at 1.5 or 2.5
    longer = [{"step": s, "iteration": 1, "kl": 3.3e-5 * s} for s in range(1, 21)]
    raw, smooth = metrics_figure(longer, smoothing=0.6).data
    assert list(smooth.y) == ema(list(raw.y), 0.5)  # 20 steps: an EMA that remembers 2 of them
    assert metrics_figure(_rows(30)).layout.xaxis.dtick is None  # plotly's own whole-step ticks


def test_sparse_series_are_not_smoothed_and_series_in_a_panel_differ_in_dash():
    rows = _rows(6)
    rows[0]["eval/accuracy"], rows[5]["eval/accuracy"] = 0.2, 0.6
    fig = metrics_figure(rows, smoothing=0.9)
    [evaluation] = [t for t in fig.data if t.name == "eval/accuracy"]
    assert list(evaluation.y) == [0.2, 0.6] and "markers" in evaluation.mode
    shown = {t.name: t for t in fig.data if t.showlegend is not False}
    assert shown["correct_frac"].line.dash != shown["eval/accuracy"].line.dash


def test_every_evaluation_metric_is_drawn_in_the_accuracy_panel_on_zero_to_one():
    rows = _rows(6)
    for row in (rows[0], rows[5]):
        row.update(
            {"eval/accuracy": 0.3, "eval/accuracy_strict": 0.1, "eval/accuracy_flexible": 0.3, "eval/format": 0.2}
        )
    drawn = tuple(k for k in EVAL_METRICS if k != "eval/accuracy")  # eval/accuracy is eval/accuracy_flexible here
    assert dict(chart_panels(rows))["accuracy"] == ("correct_frac", *drawn)
    fig = metrics_figure(rows, smoothing=0.6)
    shown = {t.name: t for t in fig.data if t.showlegend is not False}
    assert {_panel_of(fig)[k] for k in drawn} == {"accuracy"}
    assert tuple(fig.layout["yaxis" + shown["eval/format"].yaxis[1:]].range) == (-0.03, 1.03)
    assert len({shown[k].line.dash for k in ("correct_frac", *drawn)}) == 4  # told apart in grey too
    assert all("markers" in shown[k].mode for k in drawn)  # evaluations are sparse: points, not smoothed


def test_picked_metrics_limit_the_panels():
    fig = metrics_figure(_rows(), picked=["kl", "learning_rate"])
    assert [a.text for a in fig.layout.annotations] == ["KL and loss", "learning rate"]
    assert fig.layout.showlegend  # the first legend too, though it names one metric
    assert {t.name for t in fig.data if t.showlegend is not False} == {"kl", "learning_rate"}
    none = metrics_figure(_rows(), picked=["rm/loss"])
    assert not none.data and "None of the picked metrics" in none.layout.annotations[0].text


def test_recorded_metrics_in_panel_order():
    rows = [{"step": 1, "iteration": 1, "kl": 0.1, "reward_mean": 0.5, "zz": 1.0, "loss": None}]
    assert recorded_metrics(rows) == ["reward_mean", "kl", "zz"]
    assert {k for _, keys in PANELS for k in keys} == {m.name for m in METRIC_REGISTRY if m.panel}


def test_compare_figure_draws_each_run_and_shares_on_zero_to_one():
    compared = {
        "runs": [{"run_id": 1, "name": "a", "config": {}}, {"run_id": 2, "name": "b", "config": {}}],
        "differing_keys": [],
        "metrics": {"1": [{"step": 1, "correct_frac": 0.5}], "2": []},
    }
    fig = compare_figure(compared, ["correct_frac", "kl"])
    assert [t.name for t in fig.data] == ["#1 a", "#1 a", "#2 b", "#2 b"]
    assert tuple(fig.layout.yaxis.range) == (-0.03, 1.03) and fig.layout.yaxis2.range is None
