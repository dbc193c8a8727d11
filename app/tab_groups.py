"""The Groups tab: a run's recorded steps on a slider (at its right end it follows the latest step), the
step's groups in a sortable table (largest reward spread first, by default: the groups that teach the most),
a warning when most of them have the same reward for every output, and one group's G completions side by
side, each token coloured by its advantage."""
import html

import gradio as gr

from app import api
from app.render import group_html, groups_frame, zero_spread_banner
from app.tab_shared import PRIVATE, QUIET, Shared

GROUP_ORDERS = (("sampling order", "position"), ("reward spread (largest first)", "spread"),
                ("reward mean (highest first)", "mean"), ("reward mean (lowest first)", "mean_asc"))


def build_groups_tab(shared: Shared) -> None:
    """The tab and its listeners: the slider follows the run's recorded steps; a step or an order shows its
    groups and the first one; a click on a row shows that group."""
    with gr.Tab("Groups", id="groups", elem_id="tab-groups"):
        with gr.Row():
            shared.groups_run_select.render()
            step_slider = gr.Slider(0, 1, value=0, step=1, label="Step (at the right end: follows the latest)",
                                    elem_id="group-step")
            group_order = gr.Dropdown(list(GROUP_ORDERS), value="spread", label="Sort groups by",
                                      elem_id="group-order")
        banner = gr.HTML(elem_id="groups-banner", visible=False)
        groups_table = gr.Dataframe(groups_frame([]), interactive=False, elem_id="groups-table",
                                    label="Groups at this step (click a row to show it)")
        group_view = gr.HTML(elem_id="group-view")
        steps_seen = gr.State(None)  # (run_id, group steps) last offered

    run_select = shared.groups_run_select
    steps_io = ([run_select, step_slider, steps_seen], [step_slider, steps_seen])
    run_select.change(_refresh_steps, *steps_io, **PRIVATE)
    shared.timer.tick(_refresh_steps, *steps_io, **QUIET)
    step_inputs = [run_select, step_slider, group_order, steps_seen]
    step_slider.change(_show_step, step_inputs, [banner, groups_table, group_view], **PRIVATE)
    group_order.change(_show_step, step_inputs, [banner, groups_table, group_view], **PRIVATE)
    groups_table.select(_show_group, None, group_view, **PRIVATE)


def _nearest_step(steps: list[int], value) -> int | None:
    """The recorded step a slider value stands for: the latest recorded step at or below it (else the first)."""
    if not steps:
        return None
    if value is None:
        return steps[-1]
    below = [s for s in steps if s <= value]
    return below[-1] if below else steps[0]


def _refresh_steps(run_id, value, seen):
    """The slider over the run's recorded steps, when they changed (``seen``: the run and steps offered last);
    at the latest step it moves on to the new latest, moved back it stays."""
    if run_id is None:
        return gr.Slider(0, 1, value=0), None
    try:
        steps = api.group_steps(run_id)
    except api.ApiError:
        return gr.Slider(0, 1, value=0), None
    if seen is not None and seen[0] == run_id and seen[1] == steps:
        return gr.skip(), seen
    if not steps:
        return gr.Slider(0, 1, value=0, label="Step (no groups recorded yet)"), [run_id, steps]
    previous = seen[1] if seen is not None and seen[0] == run_id else []
    following = not previous or value is None or value >= previous[-1]
    value = steps[-1] if following else _nearest_step(steps, value)
    low = steps[0] if steps[0] < steps[-1] else steps[-1] - 1
    return (gr.Slider(low, steps[-1], value=value, step=1,
                      label=f"Step ({len(steps)} recorded; at the right end: follows the latest)"),
            [run_id, steps])


def _show_step(run_id, value, order, seen):
    """The groups of the step the slider stands for, in ``order``, the first of them, and above them a warning
    when most carry no gradient."""
    steps = seen[1] if seen is not None and seen[0] == run_id else []
    step = _nearest_step(steps, value)
    if run_id is None or step is None:
        return gr.HTML(visible=False), groups_frame([]), "<div>No groups recorded yet.</div>"
    try:
        groups = api.list_groups(run_id, step, order)
        first = api.get_group(groups[0]["group_id"]) if groups else None
    except api.ApiError as e:
        return gr.HTML(visible=False), groups_frame([]), f'<div class="run-error">{html.escape(str(e))}</div>'
    banner = zero_spread_banner(groups)
    return (gr.HTML(banner, visible=bool(banner)), groups_frame(groups),
            group_html(first) if first else "<div>No groups at this step.</div>")


def _show_group(evt: gr.SelectData):
    """The group of the clicked row."""
    try:
        return group_html(api.get_group(evt.row_value[0]))
    except api.ApiError as e:
        return f'<div class="run-error">{html.escape(str(e))}</div>'
