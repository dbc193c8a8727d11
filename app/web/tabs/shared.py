"""What the dashboard's tabs share: the components that more than one tab reads or writes, and the listener
options of the UI's own events.

app.web.ui.build_ui makes one :class:`Shared` and hands it to each tab builder (app/tab_*.py). The run pickers
and the timer are made here unrendered: the tab they belong to places its picker (``.render()``), build_ui
places the timer after the tabs, and a tab built earlier (Launch, Runs) can already name them in its
listeners. So is the Run tab's gradient chart: the Run tab places and redraws it, the Groups tab (built later)
answers its clicks.

The timer's tick only looks at the store (:func:`store_state`, a few bytes); the tabs refresh on a change of
``store_seen``, so a page open while nothing runs redraws nothing and costs one small request a tick.

Every tab calls the service through :func:`attempt` and shows a refusal with :func:`error_html`: one place masks
the secrets in a refusal's message (as :func:`call_api` does for the API's clients and the Run tab's downloads) and escapes it.
"""

import hashlib
import html
import json
import secrets
import sys
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import gradio as gr

from app.core import auth
from app.core.run_status import ACTIVE_STATUSES
from app.service import api
from app.web.tabs.components import Picker
from app.web.views.diagnose import CHART_CLICK_JS

REFRESH_SECONDS = 2.0  # the timer's period while a run is queued or running
IDLE_REFRESH_SECONDS = 10.0  # its period while none is: a run launched elsewhere shows within this
PRIVATE = dict(api_visibility="private")  # the UI's own listeners: not part of the API
QUIET = dict(api_visibility="private", show_progress="hidden")  # timer refreshes: no spinner


def call_api(fn, *args, **kwargs):
    """Run an api function. An ApiError (a refused request) reaches the client as gr.Error with its message; any
    other error as a generic one with an id, its traceback in the server's log under that id (a database's
    message, SQL or a server path never reaches a client). Passwords in URLs are masked in both."""
    try:
        return fn(*args, **kwargs)
    except api.ApiError as e:
        raise gr.Error(auth.mask_secrets(str(e)), print_exception=False) from None
    except Exception:
        error_id = secrets.token_hex(4)
        print(
            auth.mask_secrets(f"grpo-dashboard: error {error_id} in {fn.__name__}:\n{traceback.format_exc()}"),
            file=sys.stderr,
            flush=True,
        )
        raise gr.Error(
            f"internal error {error_id}: the request failed; the server's log has the details", print_exception=False
        ) from None


@dataclass(frozen=True)
class Attempt:
    """What a service call gave a tab: its ``value``, or ``error``, the refusal's message with its secrets masked."""

    value: Any = None
    error: str | None = None  # None: the call was not refused
    key: str | None = None  # the run-spec key a refused spec names (api.ApiError's), else None

    @property
    def ok(self) -> bool:
        """Whether the call returned (was not refused)."""
        return self.error is None


def attempt(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Attempt:
    """``fn(*args, **kwargs)`` with a refusal (api.ApiError) caught as the attempt's masked ``error``; any other
    exception propagates. For example ``got = attempt(api.get_run, run_id)``, then ``got.value`` if ``got.ok``,
    else ``error_html(got.error)``."""
    try:
        return Attempt(value=fn(*args, **kwargs))
    except api.ApiError as e:
        return Attempt(error=auth.mask_secrets(str(e)), key=e.key)


def error_html(message: str, css_class: str = "error", prefix: str = "", data: dict[str, str] | None = None) -> str:
    """``message`` after ``prefix``, escaped, in a ``<div>`` of ``css_class`` with a ``data-<name>`` attribute per
    item of ``data``. For example ``error_html(got.error, "run-error")``."""
    attributes = "".join(f' data-{name}="{html.escape(value)}"' for name, value in (data or {}).items())
    return f'<div class="{css_class}"{attributes}>{html.escape(prefix + message)}</div>'


@contextmanager
def fold(title: str, elem_id: str | None = None, elem_classes: tuple[str, ...] = ()) -> Iterator[gr.Column]:
    """A folded part of a tab, drawn with the tab and shown or hidden by the page alone: its head is a button
    (``.fold-toggle``, its ``aria-expanded`` the fold's state; app.web.ui's DASHBOARD_JS toggles it and
    ``grpoOpenFold(element)`` opens the fold around an element), its body hidden by CSS while folded. A Gradio
    Accordion draws a closed fold's fields only when it opens, and a moment later sets each to the value the page
    was built with, over what was typed or picked in that moment (a Manage click's run, a value typed at once).
    Yields the fold's column (``visible`` updates hide the whole fold); the body's components go in the block."""
    head = f'<button type="button" class="fold-toggle" aria-expanded="false">{html.escape(title)}</button>'
    with gr.Column(elem_id=elem_id, elem_classes=["fold", *elem_classes]) as column:
        gr.HTML(head, elem_classes=["fold-head"], padding=False)
        with gr.Column(elem_classes=["fold-body"]):
            yield column


@dataclass(frozen=True)
class Shared:
    """The cross-tab components: opening a run switches tabs and sets the run pickers, and the timer
    refreshes the Runs table, the Run view and the Groups steps."""

    demo: gr.Blocks  # its load event fills the page on opening
    tabs: gr.Tabs  # a listener selects "run" or "launch" through it
    timer: gr.Timer  # every REFRESH_SECONDS (IDLE_REFRESH_SECONDS while nothing runs) it sets store_seen
    store_seen: gr.State  # store_state() at the last tick: the tabs' refreshes listen to its change
    run_select: gr.Dropdown  # the Run tab's run
    groups_run_select: gr.Dropdown  # the Groups tab's run, kept equal to the Run tab's
    compare_select: gr.Dropdown  # the Compare tab's runs (several)
    gradient_chart: gr.HTML  # the Run tab's "Where the gradient comes from"; a click opens groups in the Groups tab


def make_shared(demo: gr.Blocks, tabs: gr.Tabs) -> Shared:
    """The shared components of ``demo``, whose tabs are ``tabs``; the pickers and the timer are still to render."""
    return Shared(
        demo=demo,
        tabs=tabs,
        timer=gr.Timer(REFRESH_SECONDS, render=False),
        store_seen=gr.State(None, render=False),
        run_select=Picker([], value=None, label="Run", elem_id="run-select", render=False),
        groups_run_select=Picker([], value=None, label="Run", elem_id="groups-run-select", render=False),
        compare_select=Picker([], value=[], multiselect=True, label="Runs", elem_id="compare-runs", render=False),
        gradient_chart=gr.HTML(elem_id="gradient-chart", js_on_load=CHART_CLICK_JS, render=False),
    )


def tick(seen: str | None) -> tuple[str, object]:
    """The timer's tick: the store's state (:func:`store_state`) for ``store_seen``, and the timer's period
    when it must change (REFRESH_SECONDS while a run is queued or running, IDLE_REFRESH_SECONDS otherwise)."""
    state = store_state()
    active = "@" in state
    if seen is not None and ("@" in seen) == active:
        return state, gr.skip()
    return state, gr.Timer(REFRESH_SECONDS if active else IDLE_REFRESH_SECONDS)


def store_state() -> str:
    """What the views draw from, in a few bytes: a digest of every run's row (status, step, phase, name, tags,
    archived; a deleted or new run changes it too) and of the newest metric, group and log line, and, while a
    run is queued or running, the time of the tick, so that every tick redraws the views. While nothing is queued
    or running and nothing is written it stays the same from tick to tick: nothing is redrawn. (A running run's
    elapsed time also counts on in the page between two ticks, app.web.views.run.clock_html.)"""
    runs, writes = api.store_snapshot()
    active = any(run["status"] in ACTIVE_STATUSES for run in runs)
    rows = json.dumps([runs, writes], sort_keys=True, default=str)
    return hashlib.sha1(rows.encode()).hexdigest() + (f"@{time.time():.1f}" if active else "")
