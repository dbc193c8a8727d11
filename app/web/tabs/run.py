"""The Run tab: one run's progress (its phase, iteration, step, ETA and latest key numbers), live charts of the
metrics it recorded (smoothed, a chosen few or all), where the gradient comes from (each step's groups all
right, all wrong or mixed; a click on a bar opens those groups in the Groups tab), the reward model's refreshes,
cancel, exports, "Launch again" (the Launch form filled from its config, under a new name), its config and its
log (which follows its newest lines); redrawn when the run changes and on every tick, where anything new was
recorded. With eval_samples, Pass@K and Maj@K against K at two evaluations (app.web.tabs.run_eval). Buttons that
do not apply to the run (Cancel once it finished, the trained policy before it completed, the LoRA adapter of a
run without one) are disabled or hidden. "Trained policy" downloads it in the dtype the model
came in (bf16 for most hub models), "Trained policy (fp32)" as it trained (app.service.exports)."""

import re

import gradio as gr

from app.core.run_status import ACTIVE_STATUSES, RunStatus
from app.service import api, exports
from app.service.health import training_rows
from app.web.tabs.launch import LaunchForm, form_values
from app.web.tabs.run_eval import build_eval_curves
from app.web.tabs.run_try import build_try
from app.web.tabs.shared import PRIVATE, QUIET, Shared, attempt, call_api, error_html
from app.web.views.charts import SMOOTHING, SMOOTHING_INFO, metrics_figure, recorded_metrics
from app.web.views.diagnose import gradient_chart_html
from app.web.views.run import health_html, progress_html, rm_refresh_frame
from grpo_engine.spec.config import FIELDS

NO_RUN = "<div>No run selected.</div>"
EXPORTS = (
    ("export-parquet", "Groups as Parquet", "parquet", "source"),
    ("export-csv", "Groups as CSV", "csv", "source"),
    ("export-eval-parquet", "Evaluations as Parquet", "eval-parquet", "source"),
    ("export-eval-csv", "Evaluations as CSV", "eval-csv", "source"),
    ("export-config", "Config as JSON", "config", "source"),
    ("export-model", "Trained policy", "model", "source"),
    ("export-model-fp32", "Trained policy (fp32)", "model", "fp32"),
    ("export-adapter", "LoRA adapter", "adapter", "source"),
)  # (elem_id, button text, export kind, dtype: the trained model's, "source" or "fp32")
_NUMBERED = re.compile(r"^(.*) \((\d+)\)$")  # a name ending in " (n)"
# the health badge: a click on a warning (its data-rule) asks for its evidence to be charted
HEALTH_CLICK = (
    "element.addEventListener('click', e => { const li = e.target.closest('[data-rule]');"
    " if (li) trigger('click', {rule: li.dataset.rule}); });"
)


def build_run_tab(shared: Shared, launch: LaunchForm) -> None:
    """The tab and its listeners: show the run, redraw its charts when the smoothing or the metrics picked
    change, cancel it, export it, launch it again from the Launch tab."""
    with gr.Tab("Run", id="run", elem_id="tab-run"):
        with gr.Row():
            shared.run_select.render()
            cancel_button = gr.Button(
                "Cancel run", variant="stop", elem_id="cancel-button", scale=0, min_width=170, interactive=False
            )
            relaunch_button = gr.Button("Launch again", elem_id="relaunch-button", scale=0, min_width=170)
        progress = gr.HTML(elem_id="run-progress")
        health = gr.HTML(elem_id="run-health", js_on_load=HEALTH_CLICK)
        shared.gradient_chart.render()
        smoothing, picked = _chart_controls()
        charts = gr.Plot(show_label=False, elem_id="run-charts")
        build_eval_curves(shared.run_select, charts)  # Pass@K and Maj@K of two evaluations, for eval_samples > 0
        build_try(shared.run_select, charts)  # a question tried by hand on the run's models
        rm_table = gr.Dataframe(
            rm_refresh_frame([]),
            interactive=False,
            visible=False,
            label="Reward model: first training (step 0) and refresh after each iteration "
            "(held-out accuracy on fresh policy samples)",
            elem_id="rm-refreshes",
        )
        with gr.Row(equal_height=True):
            buttons = {
                elem_id: gr.Button(text, size="sm", elem_id=elem_id, interactive=kind not in ("model", "adapter"))
                for elem_id, text, kind, _ in EXPORTS
            }
        export_file = gr.File(label="Download", interactive=False, elem_id="export-file", height=60, visible=False)
        with gr.Row():
            config_view = gr.JSON(label="Config", elem_id="run-config")
            log_view = gr.Textbox(
                label="Log", lines=14, max_lines=14, interactive=False, autoscroll=True, elem_id="run-log"
            )
        chart_seen = gr.State(None)  # [run_id, metric rows, last step, log lines, last line, recorded metrics]

    run_select = shared.run_select
    health.click(_chart_evidence, [run_select, smoothing], [picked, charts], **PRIVATE)
    relaunch_button.click(_relaunch, run_select, [*launch.inputs, shared.tabs, launch.result], **PRIVATE)
    outputs = [
        progress,
        health,
        charts,
        shared.gradient_chart,
        rm_table,
        config_view,
        log_view,
        chart_seen,
        picked,
        cancel_button,
        buttons["export-model"],
        buttons["export-model-fp32"],
        buttons["export-adapter"],
    ]
    inputs = [run_select, chart_seen, smoothing, picked]
    # a tick and a change of run in one queue, one at a time: a tick that read the run before a Launch or a pick
    # lands before the change's view of the new run, never after it
    run_select.change(_show_run, inputs, outputs, concurrency_id="run-view", **PRIVATE)
    shared.store_seen.change(_show_run, inputs, outputs, concurrency_id="run-view", **QUIET)
    smoothing.change(_redraw, [run_select, smoothing, picked], charts, trigger_mode="always_last", **QUIET)
    picked.input(_redraw, [run_select, smoothing, picked], charts, trigger_mode="always_last", **QUIET)
    cancel_button.click(_cancel, run_select, [progress, cancel_button], **PRIVATE)
    for elem_id, _, kind, dtype in EXPORTS:
        buttons[elem_id].click(_export(kind, dtype), run_select, export_file, **PRIVATE)


def _chart_controls() -> tuple[gr.Slider, gr.Dropdown]:
    """The charts' controls, in a row: the smoothing and the metrics picked (none: every recorded metric)."""
    with gr.Row(elem_id="chart-controls"):
        smoothing = gr.Slider(
            0,
            0.99,
            value=SMOOTHING,
            step=0.01,
            label="Smoothing",
            info=SMOOTHING_INFO,
            elem_id="chart-smoothing",
            scale=1,
        )
        picked = gr.Dropdown(
            [],
            value=[],
            multiselect=True,
            label="Metrics to chart",
            info="None picked: every recorded metric",
            elem_id="chart-metrics",
            scale=2,
        )
    return smoothing, picked


def next_name(name: str) -> str:
    """The name a relaunch proposes: "<name> (2)", or the next number where the name already ends in " (n)"."""
    numbered = _NUMBERED.match(name)
    if numbered:
        return f"{numbered.group(1)} ({int(numbered.group(2)) + 1})"
    return f"{name} (2)" if name else name


def _relaunch(run_id):
    """The Launch form's values from the run's config under a new name, and the Launch tab opened on them."""
    if run_id is None:
        return [gr.skip()] * len(FIELDS) + [gr.skip(), NO_RUN]
    got = attempt(api.get_run, run_id)
    if not got.ok:
        return [gr.skip()] * len(FIELDS) + [gr.skip(), error_html(got.error)]
    run = got.value
    config = {**run["config"], "name": next_name(run["config"].get("name") or run["name"])}
    values = form_values([config.get(f.name, f.default) for f in FIELDS])
    return values + [
        gr.Tabs(selected="launch"),
        f'<div class="ok">The form holds the config of run {run_id}: change what you like, then Launch.</div>',
    ]


def _button_states(run: dict | None) -> tuple:
    """Cancel, "Trained policy", "Trained policy (fp32)" and "LoRA adapter" for ``run``: Cancel while it is queued
    or running and not yet asked to stop; the policy (both) once it completed, unless it only evaluated; the adapter
    only for LoRA runs (hidden otherwise), once completed."""
    if run is None:
        return tuple(gr.Button(interactive=False) for _ in range(4))
    config = run.get("config") or {}
    status, lora = run["status"], config.get("lora_rank", 0) > 0
    trained = status == RunStatus.COMPLETED and config.get("steps_per_iteration") != 0
    can_cancel = status in ACTIVE_STATUSES and not run.get("cancel_requested")
    return (
        gr.Button(interactive=can_cancel),
        gr.Button(interactive=trained),
        gr.Button(interactive=trained),
        gr.Button(interactive=trained and lora, visible=lora),
    )


def _show_run(run_id, seen, smoothing, picked):
    """Progress, the health badge (app.service.run_health caches the warnings) and buttons always; charts (the gradient
    chart too: its clicks are the Groups tab's, app.web.tabs.groups_find), RM table, config and log only when a metric
    or a log line was added (``seen`` holds what was drawn last); the config only when another run is picked (a
    run's config never changes); the metric picker's choices when the recorded metrics change (reset to none on
    another run). One listener reads the run once a tick for all of them."""
    if run_id is None:
        if api.list_runs():  # the Runs tab's refresh picks the newest in a moment: keep what is shown till then
            return (gr.skip(),) * 13
        return (
            NO_RUN,
            "",
            None,
            "",
            gr.Dataframe(visible=False),
            None,
            "",
            None,
            gr.Dropdown([], value=[]),
            *_button_states(None),
        )
    got = attempt(lambda: (api.get_run(run_id), api.get_metrics(run_id), api.get_logs(run_id)))
    if not got.ok:
        return (
            error_html(got.error, "run-error"),
            "",
            None,
            "",
            gr.Dataframe(visible=False),
            None,
            "",
            None,
            gr.skip(),
            *_button_states(None),
        )
    run, metrics, logs = got.value
    recorded = recorded_metrics(metrics)
    key = [
        run_id,
        len(metrics),
        metrics[-1]["step"] if metrics else None,
        len(logs),
        logs[-1] if logs else None,
        recorded,
    ]
    same_run = seen is not None and seen[0] == run_id
    picker = (
        gr.skip()
        if same_run and seen[5:] == [recorded]
        else gr.Dropdown(recorded, value=[v for v in picked or [] if v in recorded] if same_run else [])
    )
    evaluation_only = run["config"].get("steps_per_iteration") == 0
    health = health_html(run["warnings"], len(training_rows(metrics)), evaluation_only=evaluation_only)
    head = (progress_html(run, metrics=metrics), health)
    if seen is not None and key == list(seen):
        return *head, gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip(), seen, picker, *_button_states(run)
    refreshes = rm_refresh_frame(metrics)
    return (
        *head,
        metrics_figure(metrics, smoothing, picked if same_run else None),
        gradient_chart_html(metrics),
        gr.Dataframe(value=refreshes, visible=not refreshes.empty),
        gr.skip() if same_run else run["config"],
        "\n".join(logs),
        key,
        picker,
        *_button_states(run),
    )


def _chart_evidence(run_id, smoothing, evt: gr.EventData):
    """The metrics of the clicked warning picked in the chart, and the charts redrawn with them."""
    rule = getattr(evt, "rule", None)
    if run_id is None or not rule:
        return gr.skip(), gr.skip()
    run = attempt(api.get_run, run_id)
    warning = next((w for w in run.value["warnings"] if w["rule"] == rule), None) if run.ok else None
    metrics = attempt(api.get_metrics, run_id) if warning is not None else None
    if metrics is None or not metrics.ok:
        return gr.skip(), gr.skip()
    picked = [m for m in warning["metrics"] if m in recorded_metrics(metrics.value)]
    return gr.Dropdown(value=picked), metrics_figure(metrics.value, smoothing, picked)


def _redraw(run_id, smoothing, picked):
    """The charts again, with another smoothing or other metrics picked."""
    if run_id is None:
        return None
    got = attempt(api.get_metrics, run_id)
    return metrics_figure(got.value, smoothing, picked) if got.ok else gr.skip()


def _cancel(run_id):
    """Ask the run to stop, and show its progress after the request (Cancel then disabled)."""
    if run_id is None:
        return NO_RUN, gr.Button(interactive=False)
    got = attempt(_cancel_and_read, run_id)
    if not got.ok:
        return error_html(got.error, "run-error"), gr.skip()
    run, metrics = got.value
    return progress_html(run, metrics=metrics), _button_states(run)[0]


def _cancel_and_read(run_id: int) -> tuple[dict, list[dict]]:
    """Ask the run to stop, then read the run and its metrics as they stand after the request."""
    api.cancel_run(run_id)
    return api.get_run(run_id), api.get_metrics(run_id)


def _export(kind, dtype):
    """The listener of one export button: the file of the run's export of that kind (a trained model in ``dtype``),
    offered for download."""

    def export(run_id):
        """The export's file, and the download box shown with it."""
        if run_id is None:
            raise gr.Error("No run selected.")
        return gr.File(value=call_api(exports.export_run, run_id, kind, dtype), visible=True)

    return export
