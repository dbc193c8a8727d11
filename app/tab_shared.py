"""What the dashboard's tabs share: the components that more than one tab reads or writes, and the listener
options of the UI's own events.

app.ui.build_ui makes one :class:`Shared` and hands it to each tab builder (app/tab_*.py). The run pickers
and the timer are made here unrendered: the tab they belong to places its picker (``.render()``), build_ui
places the timer after the tabs, and a tab built earlier (Launch, Runs) can already name them in its
listeners. So is the Run tab's gradient chart: the Run tab places and redraws it, the Groups tab (built later)
answers its clicks.
"""
from dataclasses import dataclass

import gradio as gr

from app.render_diagnose import CHART_CLICK_JS

REFRESH_SECONDS = 2.0
PRIVATE = dict(api_visibility="private")  # the UI's own listeners: not part of the API
QUIET = dict(api_visibility="private", show_progress="hidden")  # timer refreshes: no spinner


@dataclass(frozen=True)
class Shared:
    """The cross-tab components: opening a run switches tabs and sets the run pickers, and the timer
    refreshes the Runs table, the Run view and the Groups steps."""

    demo: gr.Blocks  # its load event fills the page on opening
    tabs: gr.Tabs  # a listener selects "run" or "launch" through it
    timer: gr.Timer  # every REFRESH_SECONDS
    run_select: gr.Dropdown  # the Run tab's run
    groups_run_select: gr.Dropdown  # the Groups tab's run, kept equal to the Run tab's
    compare_select: gr.Dropdown  # the Compare tab's runs (several)
    gradient_chart: gr.HTML  # the Run tab's "Where the gradient comes from"; a click opens groups in the Groups tab


def make_shared(demo: gr.Blocks, tabs: gr.Tabs) -> Shared:
    """The shared components of ``demo``, whose tabs are ``tabs``; the pickers and the timer are still to render."""
    return Shared(
        demo=demo, tabs=tabs,
        timer=gr.Timer(REFRESH_SECONDS, render=False),
        run_select=gr.Dropdown([], value=None, label="Run", elem_id="run-select", render=False),
        groups_run_select=gr.Dropdown([], value=None, label="Run", elem_id="groups-run-select", render=False),
        compare_select=gr.Dropdown([], value=[], multiselect=True, label="Runs", elem_id="compare-runs",
                                   render=False),
        gradient_chart=gr.HTML(elem_id="gradient-chart", js_on_load=CHART_CLICK_JS, render=False),
    )
