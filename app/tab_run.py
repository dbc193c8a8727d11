"""The Run tab: one run's progress (iteration, step, ETA), live charts of every metric, the reward model's
refreshes, cancel, exports, "Launch again" (the Launch form filled from its config), its config and its log;
redrawn when the run changes and on every tick, where anything new was recorded."""
import html

import gradio as gr

from app import api, exports
from app.endpoints import call_api
from app.render import metrics_figure, progress_html, rm_refresh_frame
from app.tab_launch import LaunchForm
from app.tab_shared import PRIVATE, QUIET, Shared
from grpo_engine.config import FIELDS

NO_RUN = "<div>No run selected.</div>"
EXPORTS = (("export-parquet", "Groups as Parquet", "parquet"), ("export-csv", "Groups as CSV", "csv"),
           ("export-config", "Config as JSON", "config"), ("export-model", "Trained policy", "model"),
           ("export-adapter", "LoRA adapter", "adapter"))  # (elem_id, button text, export kind)


def build_run_tab(shared: Shared, launch: LaunchForm) -> None:
    """The tab and its listeners: show the run, cancel it, export it, launch it again from the Launch tab."""
    with gr.Tab("Run", id="run", elem_id="tab-run"):
        with gr.Row():
            shared.run_select.render()
            cancel_button = gr.Button("Cancel run", variant="stop", elem_id="cancel-button", scale=0, min_width=140)
            relaunch_button = gr.Button("Launch again", elem_id="relaunch-button", scale=0, min_width=140)
        progress = gr.HTML(elem_id="run-progress")
        charts = gr.Plot(label="Metrics", elem_id="run-charts")
        rm_table = gr.Dataframe(rm_refresh_frame([]), interactive=False, visible=False,
                                label="Reward model: first training (step 0) and refresh after each iteration "
                                      "(held-out accuracy on fresh policy samples)", elem_id="rm-refreshes")
        with gr.Row():
            export_buttons = [(gr.Button(text, size="sm", elem_id=elem_id), kind) for elem_id, text, kind in EXPORTS]
            export_file = gr.File(label="Download", interactive=False, elem_id="export-file", height=60)
        with gr.Row():
            config_view = gr.JSON(label="Config", elem_id="run-config")
            log_view = gr.Textbox(label="Log", lines=14, max_lines=14, interactive=False, elem_id="run-log")
        chart_seen = gr.State(None)  # (run_id, metric rows, log lines) last drawn

    run_select = shared.run_select
    relaunch_button.click(_relaunch, run_select, [*launch.inputs, shared.tabs, launch.result], **PRIVATE)
    outputs = [progress, charts, rm_table, config_view, log_view, chart_seen]
    run_select.change(_show_run, [run_select, chart_seen], outputs, **PRIVATE)
    shared.timer.tick(_show_run, [run_select, chart_seen], outputs, **QUIET)
    cancel_button.click(_cancel, run_select, progress, **PRIVATE)
    for button, kind in export_buttons:
        button.click(_export(kind), run_select, export_file, **PRIVATE)


def _relaunch(run_id):
    """The Launch form's values from the run's config, and the Launch tab opened on them."""
    if run_id is None:
        return [gr.skip()] * len(FIELDS) + [gr.skip(), NO_RUN]
    try:
        config = api.get_run(run_id)["config"]
    except api.ApiError as e:
        return [gr.skip()] * len(FIELDS) + [gr.skip(), f'<div class="error">{html.escape(str(e))}</div>']
    values = [config.get(f.name, f.default) for f in FIELDS]
    return values + [gr.Tabs(selected="launch"),
                     f'<div class="ok">The form holds the config of run {run_id}: change what you like, '
                     'then Launch.</div>']


def _show_run(run_id, seen):
    """Progress always; charts, RM table, config and log only when a metric or a log line was added (``seen``
    holds what was drawn last); the config only when another run is picked (a run's config never changes)."""
    if run_id is None:
        return NO_RUN, None, gr.Dataframe(visible=False), None, "", None
    try:
        run, metrics, logs = api.get_run(run_id), api.get_metrics(run_id), api.get_logs(run_id)
    except api.ApiError as e:
        return (f'<div class="run-error">{html.escape(str(e))}</div>', None, gr.Dataframe(visible=False),
                None, "", None)
    key = (run_id, len(metrics), metrics[-1]["step"] if metrics else None, len(logs), logs[-1] if logs else None)
    if seen is not None and key == tuple(seen):
        return progress_html(run), gr.skip(), gr.skip(), gr.skip(), gr.skip(), seen
    same_run = seen is not None and seen[0] == run_id
    refreshes = rm_refresh_frame(metrics)
    return (progress_html(run), metrics_figure(metrics),
            gr.Dataframe(value=refreshes, visible=not refreshes.empty),
            gr.skip() if same_run else run["config"], "\n".join(logs), list(key))


def _cancel(run_id):
    """Ask the run to stop, and show its progress after the request."""
    if run_id is None:
        return NO_RUN
    try:
        api.cancel_run(run_id)
        return progress_html(api.get_run(run_id))
    except api.ApiError as e:
        return f'<div class="run-error">{html.escape(str(e))}</div>'


def _export(kind):
    """The listener of one export button: the file of the run's export of that kind, offered for download."""
    def export(run_id):
        if run_id is None:
            raise gr.Error("No run selected.")
        return call_api(exports.export_run, run_id, kind)
    return export
