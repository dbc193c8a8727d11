"""The dashboard's charts: plotly figures drawn from a run's metric rows (app.service.api.get_metrics), nothing else.

:func:`metrics_figure` is the Run tab's chart: one panel per group of metrics (the ``panel`` of each entry of
grpo_engine.report.metrics.METRIC_REGISTRY, where ``reward/<name>`` stands for every recorded ``reward/...`` metric; a
recorded metric the registry does not name goes to "other"), two panels
a row, each with its own legend to its right, all on one step axis. Only panels with something recorded are
drawn; shares (metrics named ``*_frac``, ``*accuracy*`` or ``eval/*``) are drawn on a fixed 0 to 1 axis so that their height
means the same in every run. Each series can be smoothed (:func:`ema`): the smoothed line bold, the raw values
faint behind it.

:func:`compare_figure` is the Compare tab's: one panel per picked metric, each run a line of its own colour,
smoothed the same way. A short series is smoothed less (:func:`series_weight`), and a few steps get a tick each.
Pure functions of their arguments: no store, no Gradio.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from grpo_engine.report.metrics import METRIC_REGISTRY, family_prefix

# The Run tab's panels: (title, metric names), in registry order. A recorded metric in no panel goes to "other".
PANELS: tuple[tuple[str, tuple[str, ...]], ...] = tuple(
    (title, tuple(m.name for m in METRIC_REGISTRY if m.panel == title))
    for title in dict.fromkeys(m.panel for m in METRIC_REGISTRY if m.panel is not None)
)
OTHER = "other"
# registry metrics with no panel (the reward model's example counts, shown in its table): drawn, in "other",
# only when picked
UNCHARTED = frozenset(m.name for m in METRIC_REGISTRY if m.panel is None)
PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563", "#ca8a04")
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")  # a panel's series told apart in grey too
ROW_PX, TITLE_PX, LEGEND_PX = 230, 64, 160  # a row's height, the gap between rows, the room right of each panel
NO_STEPS = "No steps recorded yet: the charts appear once the run finishes its first step."


def ema(values: list[float], weight: float) -> list[float]:
    """The exponential moving average of ``values``: s[0] = values[0], s[t] = weight * s[t-1] +
    (1 - weight) * values[t]. No debiasing: the first value is the starting point. ``weight`` 0 returns the
    values; e.g. ema([0, 1, 1], 0.5) == [0, 0.5, 0.75]."""
    smoothed: list[float] = []
    for value in values:
        smoothed.append(value if not smoothed else weight * smoothed[-1] + (1 - weight) * value)
    return smoothed


SMOOTHING = 0.6  # the charts' EMA weight on opening (the Run and Compare tabs' Smoothing sliders)
SMOOTHING_INFO = "EMA weight of the bold lines, lowered for short runs (at most a tenth of the run); 0: the raw values"
SMOOTH_SPAN = 10  # an EMA's memory, 1 / (1 - weight) points, is at most a tenth of the series


def series_weight(weight: float, points: int) -> float:
    """The EMA weight a series of ``points`` values is drawn with: ``weight``, lowered so that the average
    remembers at most a tenth of the series (SMOOTH_SPAN), so a short run is not drawn lagging behind its
    values: 10 points or fewer are drawn raw.

    >>> series_weight(0.6, 10), series_weight(0.6, 20), series_weight(0.6, 100)
    (0.0, 0.5, 0.6)
    """
    return max(0.0, min(weight, 1 - SMOOTH_SPAN / points)) if points else 0.0


def step_ticks(fig: go.Figure, steps: list[int]) -> None:
    """Whole-step ticks on ``fig``'s x axes: a tick every step when the steps span 10 or fewer (plotly would put
    some at 1.5 and 2.5); plotly's own choice, always whole, above that."""
    if steps and max(steps) - min(steps) <= 10:
        fig.update_xaxes(dtick=1, tick0=0)


def is_share(name: str) -> bool:
    """Whether a metric is a share between 0 and 1 (drawn on a fixed 0 to 1 axis)."""
    return (
        name.endswith("_frac")
        or "accuracy" in name
        or name.startswith(("tokens/adv_", "eval/"))
        or name == "repetition"
    )


RM_PANEL = "reward model"
POLICY_ACCURACY = "eval/accuracy"  # drawn in the reward model's panel too: its accuracy beside the policy's
EVAL_RULES = {"eval/accuracy_strict", "eval/accuracy_flexible"}  # eval/accuracy equals the one answer_match names
REFRESH = "rm/accuracy_after"  # recorded at each training of the reward model: step 0 and every refresh


def rm_refresh_steps(metrics: list[dict]) -> list[int]:
    """The steps after which the learned reward model was refreshed (its trainings after step 0), ascending.

    >>> rm_refresh_steps([{"step": 0, "rm/accuracy_after": 0.9}, {"step": 5}, {"step": 10, "rm/accuracy_after": 0.8}])
    [10]
    """
    return [m["step"] for m in metrics if m.get(REFRESH) is not None and m["step"] > 0]


def expand_families(keys: tuple[str, ...], recorded: set[str]) -> tuple[str, ...]:
    """A panel's metric names with each family (a name ending in ``<...>``, e.g. ``reward/<name>``) replaced by the
    recorded metrics it stands for, sorted (numbers as numbers: eval/pass@2 before eval/pass@16): ('reward_mean',
    'reward/<name>') with reward/length recorded gives ('reward_mean', 'reward/length')."""
    out: list[str] = []
    for key in keys:
        prefix = family_prefix(key)
        if prefix is None:
            out.append(key)
            continue
        members = [k for k in recorded if k.startswith(prefix)]
        out += sorted(members, key=lambda k: (int(k[len(prefix) :]) if k[len(prefix) :].isdigit() else -1, k))
    return tuple(out)


def recorded_metrics(metrics: list[dict]) -> list[str]:
    """The metric names with at least one value in ``metrics``, in panel order (then the others, sorted)."""
    recorded = {k for m in metrics for k, v in m.items() if v is not None} - {"step", "iteration"}
    known = [k for _, keys in PANELS for k in expand_families(keys, recorded)]
    return [k for k in known if k in recorded] + sorted(recorded - set(known))


def chart_panels(metrics: list[dict], picked: list[str] | None = None) -> list[tuple[str, tuple[str, ...]]]:
    """The panels to draw: (title, the metrics in it that have values), for panels with at least one;
    with ``picked`` (a non-empty list of metric names), only those metrics (else all but UNCHARTED, and
    eval/accuracy where eval/accuracy_strict and eval/accuracy_flexible are drawn: it is the one of the two that the
    run's answer_match names, a line nobody could see under its twin)."""
    recorded = set(recorded_metrics(metrics))
    recorded = recorded & set(picked) if picked else recorded - UNCHARTED
    placed = [(title, expand_families(keys, recorded)) for title, keys in PANELS]
    known = {k for _, keys in placed for k in keys}
    panels = [*placed, (OTHER, tuple(sorted(recorded - known)))]
    twin = {POLICY_ACCURACY} if not picked and EVAL_RULES <= recorded else set()  # under its twin's line
    drawn = [(title, kept) for title, keys in panels if (kept := tuple(k for k in keys if k in recorded - twin))]
    return [
        (title, keys + (POLICY_ACCURACY,) if title == RM_PANEL and POLICY_ACCURACY in recorded else keys)
        for title, keys in drawn
    ]


def _points(metrics: list[dict], key: str) -> tuple[list[int], list[float]]:
    """The steps and values of one metric, where it was recorded."""
    pairs = [(m["step"], m[key]) for m in metrics if m.get(key) is not None]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _series(
    key: str,
    steps: list[int],
    values: list[float],
    *,
    smoothing: float,
    sparse: bool,
    k: int,
    legend: str,
    label: str | None = None,
    show: bool = True,
) -> list[go.Scatter]:
    """One metric's traces in its panel (the ``k``-th series there), named ``label`` (default ``key``) in the
    legend ``legend`` (``show``: whether it has an entry there): with smoothing (its weight lowered for a short
    series, :func:`series_weight`), the raw values faint and the smoothed line bold on top, one legend entry for
    both; a sparse series (recorded on few steps, e.g. evaluations) is drawn as it is, with markers."""
    colour, dash, label = PALETTE[k % len(PALETTE)], DASHES[k % len(DASHES)], label or key
    common = dict(x=steps, legendgroup=label, legend=legend)
    weight = series_weight(smoothing, len(values))
    hover = (
        f"{label}<br>{key}, step %{{x}}: %{{y:.4g}}<extra></extra>"
        if label != key
        else f"{key}<br>step %{{x}}: %{{y:.4g}}<extra></extra>"
    )
    if sparse or weight <= 0:
        mode = "lines+markers" if sparse or len(steps) < 40 else "lines"
        return [
            go.Scatter(
                **common,
                y=values,
                name=label,
                mode=mode,
                showlegend=show,
                line=dict(color=colour, width=2, dash=dash),
                marker=dict(size=5),
                hovertemplate=hover,
            )
        ]
    raw = go.Scatter(
        **common,
        y=values,
        name=f"{label} (raw)",
        showlegend=False,
        mode="lines",
        opacity=0.3,
        line=dict(color=colour, width=1),
        hovertemplate=hover,
    )
    smooth = go.Scatter(
        **common,
        y=ema(values, weight),
        name=label,
        mode="lines",
        showlegend=show,
        line=dict(color=colour, width=2.5, dash=dash),
        hovertemplate=hover.replace("<br>", f" smoothed ({weight:.2f})<br>", 1),
    )
    return [raw, smooth]


def _y_range(metrics: list[dict], keys: tuple[str, ...]) -> list[float] | None:
    """A panel's fixed y range: 0 to 1 for shares; around the value, not plotly's +-1, for a constant series
    (a learning rate without schedule); None (plotly's own) otherwise."""
    if all(is_share(k) for k in keys):
        return [-0.03, 1.03]
    values = [m[k] for m in metrics for k in keys if m.get(k) is not None]
    if values and min(values) == max(values):
        pad = abs(values[0]) * 0.5 or 1.0
        return [values[0] - pad, values[0] + pad]
    return None


def empty_figure(message: str = NO_STEPS) -> go.Figure:
    """A small figure holding only ``message``: what the chart area shows before there is anything to draw."""
    fig = go.Figure()
    fig.add_annotation(
        text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper", font=dict(size=14, color="#6b7280")
    )
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    fig.update_layout(
        height=140,
        margin=dict(l=10, r=10, t=10, b=10),
        template="plotly_white",
        paper_bgcolor="rgba(0,0,0,0)",
        plot_bgcolor="rgba(0,0,0,0)",
    )
    return fig


def metrics_figure(metrics: list[dict], smoothing: float = 0.0, picked: list[str] | None = None) -> go.Figure:
    """The recorded metrics over steps, in panels (two a row), each panel with its own legend at its right.

    ``smoothing`` is the EMA weight (0 to 0.99; :func:`ema`) of the bold line; ``picked`` limits the panels
    to those metrics (None or empty: every recorded metric). Panels without values are left out; with no
    metric recorded yet the figure only says so."""
    panels = chart_panels(metrics, picked)
    if not panels:
        return empty_figure(NO_STEPS if not recorded_metrics(metrics) else "None of the picked metrics is recorded.")
    rows = (len(panels) + 1) // 2
    height = ROW_PX * rows + TITLE_PX * (rows - 1) + 80
    specs = [[{}, {}] for _ in range(rows)]
    if len(panels) % 2:
        specs[-1][1] = None  # an odd number of panels leaves the last cell empty: no axes there
    fig = make_subplots(
        rows=rows,
        cols=2,
        specs=specs,
        subplot_titles=[t for t, _ in panels],
        horizontal_spacing=0.16,
        vertical_spacing=TITLE_PX / height,
    )
    steps_recorded = len({m["step"] for m in metrics})
    legends = {}
    for i, (_title, keys) in enumerate(panels):
        row, col = i // 2 + 1, i % 2 + 1
        legend = "legend" if i == 0 else f"legend{i + 1}"
        for k, key in enumerate(keys):
            steps, values = _points(metrics, key)
            sparse = 2 * len(steps) < steps_recorded
            for trace in _series(key, steps, values, smoothing=smoothing, sparse=sparse, k=k, legend=legend):
                fig.add_trace(trace, row=row, col=col)
        fig.update_yaxes(range=_y_range(metrics, keys), row=row, col=col)
        xaxis = fig.get_subplot(row, col).xaxis
        yaxis = fig.get_subplot(row, col).yaxis
        legends[legend] = dict(
            x=xaxis.domain[1] + 0.01,
            y=yaxis.domain[1],
            xanchor="left",
            yanchor="top",
            font=dict(size=10),
            itemwidth=30,
            bgcolor="rgba(0,0,0,0)",
            tracegroupgap=2,
        )
    _refresh_lines(fig, rm_refresh_steps(metrics), len(panels))
    for col in (1, 2):  # the lowest panel of each column names the x axis
        bottom = max((i // 2 + 1 for i in range(len(panels)) if i % 2 + 1 == col), default=None)
        if bottom is not None:
            fig.update_xaxes(title_text="step", title_standoff=4, row=bottom, col=col)
    fig.update_yaxes(exponentformat="e")  # 2e-04, not plotly's 200µ
    for axis in [a for a in fig.layout if a.startswith("xaxis") and a != "xaxis"]:
        fig.layout[axis].matches = "x"  # one step axis: the panels line up, and zooming one zooms all
    step_ticks(fig, [m["step"] for m in metrics])
    # showlegend: plotly hides the first legend when it holds one entry, the panel's only metric
    fig.update_layout(
        height=height,
        template="plotly_white",
        margin=dict(l=55, r=LEGEND_PX, t=30, b=40),
        showlegend=True,
        paper_bgcolor="rgba(0,0,0,0)",
        plot_bgcolor="rgba(0,0,0,0)",
        uirevision="metrics",
        **legends,
    )
    return fig


def _refresh_lines(fig: go.Figure, steps: list[int], panels: int) -> None:
    """The reward model's refreshes as dashed vertical lines on every panel, named on the first ("RM v2" is the
    version trained at that step, which scores the steps after it)."""
    for version, step in enumerate(steps, start=2):
        for i in range(panels):
            fig.add_vline(
                x=step, row=i // 2 + 1, col=i % 2 + 1, line=dict(color="#9333ea", width=1, dash="dash"), opacity=0.6
            )
        fig.add_annotation(
            x=step,
            y=1,
            xref="x",
            yref="paper",
            text=f"RM v{version}",
            showarrow=False,
            yanchor="bottom",
            font=dict(size=10, color="#9333ea"),
        )


def compare_figure(compared: dict, metric_keys: list[str], smoothing: float = 0.0) -> go.Figure:
    """One panel per metric, every compared run a line in it (the same colour and dash for a run in every
    panel), smoothed as the Run tab's charts are (``smoothing``, :func:`_series`); all panels on one step axis;
    shares on a fixed 0 to 1 axis."""
    metric_keys = metric_keys or ["reward_mean"]
    fig = make_subplots(rows=len(metric_keys), cols=1, subplot_titles=metric_keys, vertical_spacing=0.12)
    every_step = []
    for j, run in enumerate(compared["runs"]):
        metrics = compared["metrics"][str(run["run_id"])]
        recorded = len({m["step"] for m in metrics})
        for i, key in enumerate(metric_keys):
            steps, values = _points(metrics, key)
            every_step += steps
            for trace in _series(
                key,
                steps,
                values,
                smoothing=smoothing,
                sparse=2 * len(steps) < recorded,
                k=j,
                legend="legend",
                label=f"#{run['run_id']} {run['name']}",
                show=i == 0,
            ):
                fig.add_trace(trace, row=i + 1, col=1)
    for i, key in enumerate(metric_keys):
        if is_share(key):
            fig.update_yaxes(range=[-0.03, 1.03], row=i + 1, col=1)
    fig.update_xaxes(title_text="step", row=len(metric_keys))
    for axis in [a for a in fig.layout if a.startswith("xaxis") and a != "xaxis"]:
        fig.layout[axis].matches = "x"  # one step axis: the panels line up, and zooming one zooms all
    step_ticks(fig, every_step)
    fig.update_layout(
        height=260 * len(metric_keys) + 80,
        template="plotly_white",
        margin=dict(l=55, r=20, t=40, b=40),
        paper_bgcolor="rgba(0,0,0,0)",
        plot_bgcolor="rgba(0,0,0,0)",
        uirevision="compare",
    )
    fig.update_yaxes(exponentformat="e")
    return fig
