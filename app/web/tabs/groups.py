"""The Groups tab: a run's recorded steps on a slider (at its right end it follows the latest step), the
step's groups in a sortable table (largest reward spread first, by default: the groups that teach the most),
a warning when most of them have the same reward for every output, and one group's G completions side by
side, each token tinted by its advantage, its KL to the reference or its surprise (every per-token number on
hover). Between the table and the group, "Find samples" searches the whole run; under the group, "This question
through time" follows its question (app.web.tabs.groups_find). A group opened from Find samples or from the Run tab's
gradient chart stays shown while a running run records new steps, until the slider, the order or a row is used."""

import gradio as gr

from app.service import api
from app.service.health import zero_spread_cause
from app.web.tabs.components import StepSlider
from app.web.tabs.groups_find import build_find, build_history, wire_find, wire_history
from app.web.tabs.shared import PRIVATE, QUIET, Shared, attempt, error_html
from app.web.views.group import COLOURINGS, flat_groups, group_html, zero_spread_banner
from app.web.views.run import groups_frame

TINTS = tuple((words, key) for key, (words, _, _) in COLOURINGS.items())  # the tint picker's (label, value)
GROUP_ORDERS = (
    ("sampling order", "position"),
    ("reward spread (largest first)", "spread"),
    ("reward mean (highest first)", "mean"),
    ("reward mean (lowest first)", "mean_asc"),
)


def build_groups_tab(shared: Shared) -> None:
    """The tab and its listeners: the slider follows the run's recorded steps; a step or an order shows its
    groups and the first one; a click on a row shows that group."""
    with gr.Tab("Groups", id="groups", elem_id="tab-groups"):
        with gr.Row():
            shared.groups_run_select.render()
            step_slider = StepSlider(
                0, 1, value=0, step=1, label="Step (at the right end: follows the latest)", elem_id="group-step"
            )
            group_order = gr.Dropdown(list(GROUP_ORDERS), value="spread", label="Sort groups by", elem_id="group-order")
        banner = gr.HTML(elem_id="groups-banner", visible=False)
        groups_table = gr.Dataframe(
            groups_frame([]),
            interactive=False,
            elem_id="groups-table",
            label="Groups at this step (click a row to show it)",
        )
        find = build_find()
        tint = gr.Radio(
            list(TINTS),
            value="advantage",
            label="Tint tokens by",
            elem_id="group-tint",
            info="hover a token for its advantage, log-probs, ratio, KL and clip",
        )
        group_view = gr.HTML(elem_id="group-view")
        shown_group = gr.State(None)  # the id of the group the view shows
        pinned = gr.State(None)  # the run whose group the view shows, opened from Find samples or the chart: the
        # slider's following that run's latest step leaves it shown
        history_button, history_view = build_history()
        steps_seen = gr.State(None)  # (run_id, group steps) last offered

    run_select = shared.groups_run_select
    steps_io = ([run_select, step_slider, steps_seen, pinned], [step_slider, steps_seen])
    run_select.change(_refresh_steps, *steps_io, **PRIVATE)
    shared.store_seen.change(_refresh_steps, *steps_io, **QUIET)
    step_inputs = [run_select, step_slider, group_order, steps_seen, tint]
    step_out = [banner, groups_table, group_view, shown_group]
    step_slider.change(_show_step, [*step_inputs, pinned], step_out, **PRIVATE)
    step_slider.release(_show_step, step_inputs, step_out, **PRIVATE).then(lambda: None, None, pinned, **PRIVATE)
    group_order.change(_show_step, step_inputs, step_out, **PRIVATE).then(lambda: None, None, pinned, **PRIVATE)
    groups_table.select(_show_group, tint, [group_view, shown_group], **PRIVATE).then(
        lambda: None, None, pinned, **PRIVATE
    )
    tint.change(_retint, [shown_group, tint], group_view, **PRIVATE)
    wire_find(
        shared,
        find,
        group_view=group_view,
        shown_group=shown_group,
        tint=tint,
        pinned=pinned,
        step_slider=step_slider,
    )
    wire_history(shared, history_button, history_view, shown_group)


def _nearest_step(steps: list[int], value) -> int | None:
    """The recorded step a slider value stands for: the latest recorded step at or below it (else the first)."""
    if not steps:
        return None
    if value is None:
        return steps[-1]
    below = [s for s in steps if s <= value]
    return below[-1] if below else steps[0]


def _refresh_steps(run_id, value, seen, pinned=None):
    """The slider over the run's recorded steps, when they changed (``seen``: the run and steps offered last);
    at the latest step it moves on to the new latest, moved back it stays. On a run just picked it starts at
    the latest step, unless a group of that run was opened with the run (``pinned``: the slider already stands at
    that group's step)."""
    if run_id is None:
        return gr.Slider(0, 1, value=0), None
    got = attempt(api.group_steps, run_id)
    if not got.ok:
        return gr.Slider(0, 1, value=0), None
    steps = got.value
    if seen is not None and seen[0] == run_id and seen[1] == steps:
        return gr.skip(), seen
    if not steps:
        return gr.Slider(0, 1, value=0, label="Step (no groups recorded yet)"), [run_id, steps]
    previous = seen[1] if seen is not None and seen[0] == run_id else []
    following = value is None or (value >= previous[-1] if previous else pinned != run_id)
    value = steps[-1] if following else _nearest_step(steps, value)
    low = steps[0] if steps[0] < steps[-1] else steps[-1] - 1
    return (
        gr.Slider(
            low,
            steps[-1],
            value=value,
            step=1,
            label=f"Step ({len(steps)} recorded; at the right end: follows the latest)",
        ),
        [run_id, steps],
    )


def _show_step(run_id, value, order, seen, tint, pinned=None):
    """The groups of the step the slider stands for, in ``order``, the first of them (and its id; not while a group
    of this run is ``pinned``), tinted by ``tint``, and above them a warning when most carry no gradient."""
    steps = seen[1] if seen is not None and seen[0] == run_id else []
    step = _nearest_step(steps, value)
    if run_id is None or step is None:
        return gr.HTML(visible=False), groups_frame([]), "<div>No groups recorded yet.</div>", None
    got = attempt(_groups_and_first, run_id, step, order)
    if not got.ok:
        return gr.HTML(visible=False), groups_frame([]), error_html(got.error, "run-error"), None
    groups, first = got.value
    banner = zero_spread_banner(
        groups, _zero_spread_cause(run_id, step) if 2 * flat_groups(groups) > len(groups) else ""
    )
    if pinned is not None and pinned == run_id:
        return gr.HTML(banner, visible=bool(banner)), groups_frame(groups), gr.skip(), gr.skip()
    return (
        gr.HTML(banner, visible=bool(banner)),
        groups_frame(groups),
        group_html(first, tint) if first else "<div>No groups at this step.</div>",
        first and first["group_id"],
    )


def _groups_and_first(run_id: int, step: int, order: str) -> tuple[list[dict], dict | None]:
    """The step's groups in ``order``, and the first of them in full (None where the step has none)."""
    groups = api.list_groups(run_id, step, order)
    return groups, api.get_group(groups[0]["group_id"]) if groups else None


def _zero_spread_cause(run_id: int, step: int) -> str:
    """The zero-spread banner's cause at ``step``, from that step's metrics and the run's config."""
    got = attempt(lambda: (api.get_metrics(run_id), api.get_run(run_id)["config"]))
    if not got.ok:
        return ""
    metrics, config = got.value
    row = next((m for m in metrics if m["step"] == step), None)
    return zero_spread_cause([row] if row else [], config)


def _show_group(tint, evt: gr.SelectData):
    """The group of the clicked row, and its id."""
    got = attempt(api.get_group, evt.row_value[0])
    if not got.ok:
        return error_html(got.error, "run-error"), None
    return group_html(got.value, tint), evt.row_value[0]


def _retint(group_id, tint):
    """The shown group again, tinted by ``tint``."""
    if group_id is None:
        return gr.skip()
    got = attempt(api.get_group, group_id)
    return group_html(got.value, tint) if got.ok else error_html(got.error, "run-error")
