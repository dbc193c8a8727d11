"""The Compare tab: several runs' curves of the chosen metrics overlaid, and their configs side by side with
the differing keys marked."""

import gradio as gr

from app.service import api
from app.web.tabs.shared import PRIVATE, Shared, attempt, error_html
from app.web.views.charts import SMOOTHING, SMOOTHING_INFO, compare_figure
from app.web.views.run import config_diff_html
from grpo_engine.report.metrics import METRICS, RM_METRICS

PICK_RUNS = '<div class="compare-note">Pick runs to compare.</div>'  # the chart's frame stays hidden until then


def build_compare_tab(shared: Shared) -> None:
    """The tab and its listener: picking runs or metrics redraws the curves and the configs."""
    with gr.Tab("Compare", id="compare", elem_id="tab-compare"):
        with gr.Row():
            shared.compare_select.render()
            compare_metrics = gr.Dropdown(
                list(METRICS) + list(RM_METRICS),
                value=["reward_mean", "eval/accuracy"],
                multiselect=True,
                label="Metrics",
                elem_id="compare-metrics",
            )
        smoothing = gr.Slider(
            0, 0.99, value=SMOOTHING, step=0.01, label="Smoothing", info=SMOOTHING_INFO, elem_id="compare-smoothing"
        )
        compare_plot = gr.Plot(label="Curves", elem_id="compare-charts")
        compare_config = gr.HTML(PICK_RUNS, elem_id="compare-config")

    inputs = [shared.compare_select, compare_metrics, smoothing]
    for component in (shared.compare_select, compare_metrics, smoothing):
        component.change(_show_compare, inputs, [compare_plot, compare_config], trigger_mode="always_last", **PRIVATE)


def _show_compare(run_ids, metric_keys, smoothing):
    """The picked runs' curves (one panel per metric, smoothed by ``smoothing``) and their configs."""
    if not run_ids:
        return None, PICK_RUNS
    got = attempt(api.compare_runs, run_ids)
    if not got.ok:
        return None, error_html(got.error, "run-error")
    return compare_figure(got.value, metric_keys, smoothing), config_diff_html(got.value)
