"""The Run tab's evaluations: two evaluations the user picks, one of the shown run and one of that run or of another
run on the same held-out questions (by default the run's first and its latest); for evaluations with
``eval_samples``, Pass@K and Maj@K against K at both (app.web.views.eval_curves); and the held-out questions that
flipped between them (app.service.evaluations.compare_evals, app.web.views.eval_flips), filtered by flip and by
text. Shown for a run that recorded an evaluation; redrawn when the Run tab redraws its charts (a metric was
recorded, another run picked), so an open page reads nothing more while nothing changes. The second pick follows
the run's newest evaluation until the user picks another, or another run."""

from dataclasses import dataclass, replace

import gradio as gr

from app.service import api
from app.service import evaluations as evaluation_api
from app.web.tabs.components import Picker
from app.web.tabs.shared import QUIET, Attempt, attempt, error_html
from app.web.views.eval_curves import curves_figure, default_pair, evaluation_row, evaluations, sampled
from app.web.views.eval_flips import FLIP_CHOICES, flips_html


def build_eval_curves(run_select: gr.Dropdown, charts: gr.Plot) -> None:
    """The pickers, the chart and the flips, placed where it is called; listeners on ``charts`` (the Run tab's), the
    pickers and the flips' filters."""
    with gr.Column(visible=False, elem_id="eval-curves") as box:
        gr.HTML('<div class="diag-title">Evaluations compared</div>', padding=False)
        with gr.Row():
            first = Picker([], label="This run's evaluation", elem_id="eval-first", scale=1)
            other = Picker([], label="Compared with run", elem_id="eval-other-run", scale=1)
            second = Picker([], label="Its evaluation", elem_id="eval-second", scale=1)
        plot = gr.Plot(show_label=False, elem_id="eval-curves-plot", visible=False)
        with gr.Row():
            flip = gr.Radio(FLIP_CHOICES, value="changed", label="Questions", elem_id="eval-flip", scale=2)
            text = gr.Textbox(label="Containing", placeholder="text in the question or an output, then Enter", scale=1,
                              elem_id="eval-text")  # fmt: skip
        flips = gr.HTML(elem_id="eval-flips")
    seen = gr.State(None)  # [run_id, the evaluations' steps] last drawn
    picks = [run_select, other, first, second, flip, text]
    shown = [box, first, other, second, plot, flips, seen]
    charts.change(_show, [*picks, seen], shown, trigger_mode="always_last", **QUIET)
    other.input(_other_run, picks, [second, plot, flips], trigger_mode="always_last", **QUIET)
    for control in (first, second, flip):
        control.input(_redraw, picks, [plot, flips], trigger_mode="always_last", **QUIET)
    text.submit(_redraw, picks, [plot, flips], trigger_mode="always_last", **QUIET)


@dataclass(frozen=True, kw_only=True)
class Picks:
    """What the user picked: the shown run's evaluation ``first``, the run compared with (``other``; None or the shown
    run: the same) and its evaluation ``second``, the flips listed and the text they hold."""

    run_id: int
    other: int | None
    first: int | None
    second: int | None
    flip: str
    text: str

    @property
    def other_run(self) -> int | None:
        """The other run compared with, None where it is the shown run."""
        return None if self.other in (None, self.run_id) else self.other


def _choices(steps: list[int]) -> list[tuple[str, int]]:
    return [(f"step {s}" + (" (before training)" if s == 0 else ""), s) for s in steps]


def _run_choices(run_id: int) -> list[tuple[str, int]]:
    """The runs a comparison can read: the shown run first ("this run"), then every other that recorded an
    evaluation's questions, newest first."""
    got = attempt(evaluation_api.evaluated_runs)
    others = [(f"run {r['run_id']} · {r['name']}", r["run_id"]) for r in (got.value if got.ok else [])]
    return [("this run", run_id)] + [c for c in others if c[1] != run_id]


def _show(run_id, other, first, second, flip, text, seen):
    """The evaluations for the run: hidden without any; the user's picks kept while they exist, the second moved to
    the newest evaluation when it showed the newest before (and compares within the run)."""
    if run_id is None:
        return gr.Column(visible=False), *(gr.skip(),) * 5, None
    got = attempt(api.get_metrics, run_id)
    if not got.ok:
        return (gr.skip(),) * 7
    steps = evaluations(got.value)
    if not steps:
        return gr.Column(visible=False), *(gr.skip(),) * 5, [run_id, []]
    if seen is not None and seen == [run_id, steps]:
        return (gr.skip(),) * 7
    a, b = default_pair(steps)
    if seen is not None and seen[0] == run_id:  # the same run, a new evaluation: keep what the user picked
        a = first if first in steps else a
        if other not in (None, run_id):  # compared with another run: that pick stays as it is
            drawn = _drawn(Picks(run_id=run_id, other=other, first=a, second=second, flip=flip, text=text), got.value)
            return (
                gr.Column(visible=True),
                Picker(_choices(steps), value=a),
                gr.skip(),
                gr.skip(),
                *drawn,
                [run_id, steps],
            )
        shown = seen[1]
        b = b if second is None or (shown and second == shown[-1]) or second not in steps else second
    return (
        gr.Column(visible=True),
        Picker(_choices(steps), value=a),
        Picker(_run_choices(run_id), value=run_id),
        Picker(_choices(steps), value=b),
        *_drawn(Picks(run_id=run_id, other=run_id, first=a, second=b, flip=flip, text=text), got.value),
        [run_id, steps],
    )


def _other_run(run_id, other, first, second, flip, text):
    """Another run to compare with picked: the second picker lists its evaluations, its latest picked (the shown run
    again: the default pair's second)."""
    if run_id is None:
        return gr.skip(), None, ""
    got = attempt(api.get_metrics, other or run_id)
    if not got.ok:
        return gr.skip(), gr.skip(), error_html(got.error, "eval-error")
    steps = evaluations(got.value)
    if other in (None, run_id):
        later = default_pair(steps)[1]
    else:
        later = steps[-1] if steps else None
    picks = Picks(run_id=run_id, other=other, first=first, second=later, flip=flip, text=text)
    return Picker(_choices(steps), value=later), *_drawn(picks)


def _drawn(picks: Picks, metrics: list[dict] | None = None) -> tuple:
    """The chart and the flips of the picks (``metrics``: the shown run's, where the caller has just read them)."""
    return _plot(picks, metrics), _flips(picks)


def _plot(picks: Picks, metrics: list[dict] | None = None):
    """Pass@K and Maj@K where either evaluation sampled outputs, else no chart."""
    mine = attempt(api.get_metrics, picks.run_id) if metrics is None else Attempt(value=metrics)
    theirs = mine if picks.other_run is None else attempt(api.get_metrics, picks.other_run)
    if not (mine.ok and theirs.ok):
        return gr.skip()
    if not (sampled(mine.value) or sampled(theirs.value)):
        return gr.Plot(value=None, visible=False)
    later = f"step {picks.second}" if picks.other_run is None else f"run {picks.other_run}, step {picks.second}"
    pair = [
        (f"step {picks.first}", evaluation_row(mine.value, picks.first)),
        (later, evaluation_row(theirs.value, picks.second)),
    ]
    return gr.Plot(value=curves_figure(pair), visible=True)


def _flips(picks: Picks) -> str:
    """The questions that flipped between the two picks (one pick alone: every question of that evaluation, as
    compared with itself)."""
    if picks.first is None:
        return ""
    if picks.second is None and picks.other_run is None:
        picks = replace(picks, second=picks.first)
    request = {"other_run_id": picks.other_run, "other_step": picks.second, "flip": picks.flip or "changed"}
    got = attempt(evaluation_api.compare_evals, picks.run_id, picks.first, text=picks.text or "", **request)
    if not got.ok:
        return error_html(got.error, "eval-error")
    return flips_html(got.value)


def _redraw(run_id, other, first, second, flip, text):
    """The chart and the flips again, for other evaluations or filters picked."""
    if run_id is None:
        return None, ""
    return _drawn(Picks(run_id=run_id, other=other, first=first, second=second, flip=flip, text=text))
