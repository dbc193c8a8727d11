"""DeepSeekMath's Figure 7: Pass@K and Maj@K against K (log scale) at two evaluations, of one run or of two.

A run with ``eval_samples`` K records, at each evaluation, ``eval/pass@k`` and ``eval/maj@k`` for k = 1, 2, 4, ... up
to K (grpo_engine.rewards.sampled_eval). :func:`evaluations` lists the steps that evaluated; :func:`curves_figure`
draws the curves of two evaluations, by default a run's first (before training) and its latest, so that what RL
changed reads as in the paper: Maj@K rising while Pass@K stays is a more robust output distribution, not a more
capable model. Pure functions of metric rows (app.service.api.get_metrics): no store, no Gradio.
"""

from __future__ import annotations

import plotly.graph_objects as go

PASS, MAJ = "eval/pass@", "eval/maj@"
COLOURS = ("#9ca3af", "#2563eb")  # the earlier evaluation grey, the later one blue
NO_CURVES = "No sampled evaluation: launch with eval_samples > 0 to record Pass@K and Maj@K."


def evaluations(metrics: list[dict]) -> list[int]:
    """The steps whose metrics hold an evaluation (eval/accuracy), in order.

    >>> evaluations([{"step": 0, "eval/accuracy": 0.2}, {"step": 1, "loss": 0.1}, {"step": 5, "eval/accuracy": 0.3}])
    [0, 5]
    """
    return [row["step"] for row in metrics if "eval/accuracy" in row]


def sampled(metrics: list[dict]) -> bool:
    """Whether the run's evaluations sampled outputs (eval/pass@k recorded: eval_samples > 0).

    >>> sampled([{"step": 0, "eval/accuracy": 0.2}]), sampled([{"step": 0, "eval/pass@1": 0.2}])
    (False, True)
    """
    return any(name.startswith(PASS) for row in metrics for name in row)


def curve(row: dict, prefix: str) -> tuple[list[int], list[float]]:
    """One evaluation's curve: the k it recorded under ``prefix`` (PASS or MAJ), ascending, and their values.

    >>> curve({"step": 3, "eval/pass@4": 0.6, "eval/pass@1": 0.3, "eval/pass@2": 0.45, "eval/maj@1": 0.3}, PASS)
    ([1, 2, 4], [0.3, 0.45, 0.6])
    """
    ks = sorted(int(name.removeprefix(prefix)) for name in row if name.startswith(prefix))
    return ks, [row[f"{prefix}{k}"] for k in ks]


def default_pair(steps: list[int]) -> tuple[int | None, int | None]:
    """The evaluations shown before the user picks: the first and the latest (one evaluation: it alone).

    >>> default_pair([0, 10, 20]), default_pair([0]), default_pair([])
    ((0, 20), (0, None), (None, None))
    """
    if not steps:
        return None, None
    return steps[0], (steps[-1] if len(steps) > 1 else None)


def evaluation_row(metrics: list[dict], step: int | None) -> dict | None:
    """The metrics row of the evaluation at ``step`` (None where there is none).

    >>> evaluation_row([{"step": 0, "eval/accuracy": 0.2}, {"step": 1, "loss": 0.1}], 0)["eval/accuracy"]
    0.2
    """
    return next((row for row in metrics if row["step"] == step and "eval/accuracy" in row), None)


def curves_figure(evaluated: list[tuple[str, dict | None]]) -> go.Figure:
    """Pass@K (solid) and Maj@K (dashed) against K on a log-2 axis for two evaluations, each ``(label, its metrics
    row)`` (a row None draws nothing), each evaluation a colour, shares on a fixed 0 to 1 axis."""
    fig = go.Figure()
    ticks: set[int] = set()
    for colour, (label, row) in zip(COLOURS, evaluated, strict=False):
        if row is None:
            continue
        for prefix, name, dash in ((PASS, "Pass@K", "solid"), (MAJ, "Maj@K", "dash")):
            ks, values = curve(row, prefix)
            ticks.update(ks)
            fig.add_trace(
                go.Scatter(
                    x=ks,
                    y=values,
                    mode="lines+markers",
                    name=f"{name}, {label}",
                    line={"color": colour, "dash": dash, "width": 2.5},
                    hovertemplate=f"{name} at {label}: K %{{x}}, %{{y:.3f}}<extra></extra>",
                )
            )
    fig.update_layout(
        height=360,
        margin={"l": 60, "r": 20, "t": 40, "b": 50},
        title={"text": "Held-out Pass@K and Maj@K (DeepSeekMath, Figure 7)", "font": {"size": 14}},
        legend={"orientation": "v", "x": 1.02, "y": 1},
        template="plotly_white",
    )
    fig.update_xaxes(type="log", title_text="K (sampled outputs per question)", tickvals=sorted(ticks))
    fig.update_yaxes(range=[0, 1.02], title_text="share of held-out questions")
    if not fig.data:
        fig.add_annotation(text=NO_CURVES, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
    return fig
