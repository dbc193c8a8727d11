"""The Run tab's evaluations: two evaluations of the run the user picks, by default the first and the latest; for a run
with ``eval_samples``, Pass@K and Maj@K against K at both (app.web.views.eval_curves); and the held-out questions that
flipped between them (app.service.evaluations.compare_evals, app.web.views.eval_flips), filtered by flip and by
text. Shown for a run that recorded an evaluation; redrawn when the Run tab redraws its charts (a metric was
recorded, another run picked), so an open page reads nothing more while nothing changes. The later pick follows the
newest evaluation until the user picks another."""

import gradio as gr

from app.service import api
from app.service import evaluations as evaluation_api
from app.web.tabs.components import Picker
from app.web.tabs.shared import QUIET, attempt, error_html
from app.web.views.eval_curves import curves_figure, default_pair, evaluations, sampled
from app.web.views.eval_flips import FLIP_CHOICES, flips_html


def build_eval_curves(run_select: gr.Dropdown, charts: gr.Plot) -> None:
    """The pickers, the chart and the flips, placed where it is called; listeners on ``charts`` (the Run tab's), the
    pickers and the flips' filters."""
    with gr.Column(visible=False, elem_id="eval-curves") as box:
        gr.HTML('<div class="diag-title">Evaluations compared</div>', padding=False)
        with gr.Row():
            first = Picker([], label="Earlier evaluation", elem_id="eval-first", scale=1)
            second = Picker([], label="Later evaluation", elem_id="eval-second", scale=1)
        plot = gr.Plot(show_label=False, elem_id="eval-curves-plot", visible=False)
        with gr.Row():
            flip = gr.Radio(FLIP_CHOICES, value="changed", label="Questions", elem_id="eval-flip", scale=2)
            text = gr.Textbox(label="Containing", placeholder="text in the question or an output, then Enter", scale=1,
                              elem_id="eval-text")  # fmt: skip
        flips = gr.HTML(elem_id="eval-flips")
    seen = gr.State(None)  # [run_id, the evaluations' steps] last drawn
    picks = [run_select, first, second, flip, text]
    charts.change(_show, [*picks, seen], [box, first, second, plot, flips, seen], trigger_mode="always_last", **QUIET)
    for control in (first, second, flip):
        control.input(_redraw, picks, [plot, flips], trigger_mode="always_last", **QUIET)
    text.submit(_redraw, picks, [plot, flips], trigger_mode="always_last", **QUIET)


def _choices(steps: list[int]) -> list[tuple[str, int]]:
    return [(f"step {s}" + (" (before training)" if s == 0 else ""), s) for s in steps]


def _show(run_id, first, second, flip, text, seen):
    """The evaluations for the run: hidden without any; the user's picks kept while they exist, the later one moved
    to the newest evaluation when it showed the newest before."""
    if run_id is None:
        return gr.Column(visible=False), gr.skip(), gr.skip(), gr.skip(), gr.skip(), None
    got = attempt(api.get_metrics, run_id)
    if not got.ok:
        return (gr.skip(),) * 6
    metrics = got.value
    steps = evaluations(metrics)
    if not steps:
        return gr.Column(visible=False), gr.skip(), gr.skip(), gr.skip(), gr.skip(), [run_id, []]
    if seen is not None and seen == [run_id, steps]:
        return (gr.skip(),) * 6
    a, b = default_pair(steps)
    if seen is not None and seen[0] == run_id:  # the same run, a new evaluation: keep what the user picked
        shown = seen[1]
        a = first if first in steps else a
        b = b if second is None or (shown and second == shown[-1]) or second not in steps else second
    return (
        gr.Column(visible=True),
        Picker(_choices(steps), value=a),
        Picker(_choices(steps), value=b),
        _plot(metrics, a, b),
        _flips(run_id, a, b, flip, text),
        [run_id, steps],
    )


def _plot(metrics: list[dict], first, second):
    """Pass@K and Maj@K for a run with a sampled evaluation, else no chart."""
    if not sampled(metrics):
        return gr.Plot(value=None, visible=False)
    return gr.Plot(value=curves_figure(metrics, first, second), visible=True)


def _flips(run_id, first, second, flip, text) -> str:
    """The questions that flipped between the two picks (one pick alone: every question of that evaluation, as
    compared with itself)."""
    if first is None:
        return ""
    later = first if second is None else second
    request = {"other_step": later, "flip": flip or "changed", "text": text or ""}
    got = attempt(evaluation_api.compare_evals, run_id, first, **request)
    if not got.ok:
        return error_html(got.error, "eval-error")
    return flips_html(got.value)


def _redraw(run_id, first, second, flip, text):
    """The chart and the flips again, for other evaluations or filters picked."""
    if run_id is None:
        return None, ""
    got = attempt(api.get_metrics, run_id)
    plot = _plot(got.value, first, second) if got.ok else gr.skip()
    return plot, _flips(run_id, first, second, flip, text)
