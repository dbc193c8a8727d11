"""The Run tab's sampled-evaluation chart: Pass@K and Maj@K against K for two evaluations of the run the user picks
(app.web.views.eval_curves), by default the first and the latest. Shown only for a run that records them
(``eval_samples`` > 0); redrawn when the Run tab redraws its charts (a metric was recorded, another run picked), so
an open page reads nothing more while nothing changes. The later pick follows the newest evaluation until the user
picks another."""

import gradio as gr

from app.service import api
from app.web.tabs.components import Picker
from app.web.tabs.shared import QUIET, attempt
from app.web.views.eval_curves import curves_figure, default_pair, evaluations


def build_eval_curves(run_select: gr.Dropdown, charts: gr.Plot) -> None:
    """The chart and its two pickers, placed where it is called; listeners on ``charts`` (the Run tab's) and on the
    pickers."""
    with gr.Column(visible=False, elem_id="eval-curves") as box:
        with gr.Row():
            first = Picker([], label="Earlier evaluation", elem_id="eval-first", scale=1)
            second = Picker([], label="Later evaluation", elem_id="eval-second", scale=1)
        plot = gr.Plot(show_label=False, elem_id="eval-curves-plot")
    seen = gr.State(None)  # [run_id, the evaluations' steps] last drawn
    charts.change(
        _show, [run_select, seen, first, second], [box, first, second, plot, seen], trigger_mode="always_last", **QUIET
    )
    for picker in (first, second):
        picker.input(_redraw, [run_select, first, second], plot, trigger_mode="always_last", **QUIET)


def _choices(steps: list[int]) -> list[tuple[str, int]]:
    return [(f"step {s}" + (" (before training)" if s == 0 else ""), s) for s in steps]


def _show(run_id, seen, first, second):
    """The chart for the run's evaluations: hidden without any; the user's picks kept while they exist, the later one
    moved to the newest evaluation when it showed the newest before."""
    if run_id is None:
        return gr.Column(visible=False), gr.skip(), gr.skip(), None, None
    got = attempt(api.get_metrics, run_id)
    if not got.ok:
        return (gr.skip(),) * 5
    metrics = got.value
    steps = evaluations(metrics)
    if not steps:
        return gr.Column(visible=False), gr.skip(), gr.skip(), None, [run_id, []]
    if seen is not None and seen == [run_id, steps]:
        return (gr.skip(),) * 5
    a, b = default_pair(steps)
    if seen is not None and seen[0] == run_id:  # the same run, a new evaluation: keep what the user picked
        shown = seen[1]
        a = first if first in steps else a
        b = b if second is None or (shown and second == shown[-1]) or second not in steps else second
    return (
        gr.Column(visible=True),
        Picker(_choices(steps), value=a),
        Picker(_choices(steps), value=b),
        curves_figure(metrics, a, b),
        [run_id, steps],
    )


def _redraw(run_id, first, second):
    """The chart again, for other evaluations picked."""
    if run_id is None:
        return None
    got = attempt(api.get_metrics, run_id)
    return curves_figure(got.value, first, second) if got.ok else gr.skip()
