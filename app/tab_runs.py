"""The Runs tab: every run, newest first, refreshed with the run pickers of the other tabs on opening and on
every tick; a click on a row opens that run in the Run tab."""
import gradio as gr

from app import api
from app.render import run_choices, runs_frame
from app.tab_shared import PRIVATE, QUIET, Shared


def build_runs_tab(shared: Shared) -> None:
    """The tab and its listeners: refresh the table and the pickers; open a clicked run."""
    with gr.Tab("Runs", id="runs", elem_id="tab-runs"):
        runs_table = gr.Dataframe(runs_frame([]), interactive=False, elem_id="runs-table",
                                  label="Runs (newest first; click a row to open it)")
        runs_seen = gr.State(None)  # the last rows shown in the table

    outputs = [runs_table, shared.run_select, shared.groups_run_select, shared.compare_select, runs_seen]
    inputs = [runs_seen, shared.run_select, shared.groups_run_select]
    shared.demo.load(_refresh_runs, inputs, outputs, **PRIVATE)
    shared.timer.tick(_refresh_runs, inputs, outputs, **QUIET)
    runs_table.select(_open_run, None, [shared.tabs, shared.run_select, shared.groups_run_select], **PRIVATE)


def _refresh_runs(seen, run_id, groups_run_id):
    """The table and the pickers' choices, when the runs changed; a picker with no run takes the newest."""
    runs = api.list_runs()
    frame = runs_frame(runs)
    rows = frame.values.tolist()
    if rows == seen and (run_id is not None or not rows):
        return gr.skip(), gr.skip(), gr.skip(), gr.skip(), seen
    newest = runs[0]["run_id"] if runs else None
    choices = run_choices(runs)
    return (frame,
            gr.Dropdown(choices=choices, value=run_id if run_id is not None else newest),
            gr.Dropdown(choices=choices, value=groups_run_id if groups_run_id is not None else newest),
            gr.Dropdown(choices=choices),
            rows)


def _open_run(evt: gr.SelectData):
    """The Run tab, on the clicked row's run (the Groups tab follows)."""
    run_id = int(evt.row_value[0])
    return gr.Tabs(selected="run"), run_id, run_id
