"""The dashboard: a Gradio app with five tabs and the named API endpoints, and the server that serves it.

Tabs: Launch (the run-spec form; app.web.tabs.launch), Runs (every run, refreshed on a change; app.web.tabs.runs), Run
(progress with iteration and ETA, live charts of every metric, reward-model refreshes, cancel, export, launch
again, config, log; app.web.tabs.run), Groups (a step's groups, sortable; the G completions of one side by side,
each token coloured by its advantage; app.web.tabs.groups) and Compare (several runs' curves and configs;
app.web.tabs.compare). What the tabs share (the tabs, the run pickers, the refresh timer) is one app.web.tabs.shared.Shared;
what they show is drawn by app.web.views.run; the styles are app/web/static/dashboard.css.

The named endpoints (app.web.endpoints) wrap app.service.api one to one and are what ``gradio_client`` calls; the UI's
own listeners are private, so the API page lists only those. With users configured (app.core.auth) the page and
every endpoint need a login.

This module imports no torch: the run is sent to the workers by task name (app.service.api).
"""

import asyncio
import importlib.util
import os
import sys
from pathlib import Path

import gradio as gr
import uvicorn
from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware
from starlette.routing import Mount

from app.core import auth
from app.core.models_folder import remove_stale_partials
from app.core.settings import Settings, get_settings
from app.store.db import upgrade_database
from app.web.endpoints import ENDPOINT_CONCURRENCY, ENDPOINTS
from app.web.guards.security import SecurityMiddleware
from app.web.tabs.compare import build_compare_tab
from app.web.tabs.groups import build_groups_tab
from app.web.tabs.launch import build_launch_tab
from app.web.tabs.run import build_run_tab
from app.web.tabs.runs import build_runs_tab
from app.web.tabs.shared import PRIVATE, QUIET, Shared, make_shared, tick

# the styles: dashboard.css (what the whole page shares) first, then one file per part of the page, by name
CSS_PATHS = sorted((Path(__file__).parent / "static").glob("*.css"), key=lambda p: (p.name != "dashboard.css", p.name))
SHUTDOWN_SECONDS = 3


# POST /logout (app.web.guards.security) ends this browser's session; the reload then shows the login form
LOGOUT_JS = "() => fetch('logout', {method: 'POST', credentials: 'same-origin'}).then(() => window.location.reload())"
# First in the page's <head> (app.web.guards.security puts it there), ahead of Gradio's scripts: Gradio's status tracker counts a pending event's seconds in a
# requestAnimationFrame loop that only a change of the event's status ends. The page's own loading tracker is
# removed while still pending, so its loop would draw a frame every 16 ms for as long as the page is open (5-8% of
# a core in the browser, bench/idle_cpu.py). grpoEndStrayTimers() (called by DASHBOARD_JS once the page is up)
# skips one round of those counters' callbacks, which ends every loop running then; an event pending then keeps
# working and its next pending state starts a new count.
HEAD_JS = """<script>(() => {
  const raf = window.requestAnimationFrame.bind(window);
  let endUntil = 0;
  window.requestAnimationFrame = (cb) => raf((time) => {
    if (performance.now() < endUntil && String(cb).includes('performance.now()')) return;
    cb(time);
  });
  window.grpoEndStrayTimers = () => { endUntil = performance.now() + 100; };
})();</script>"""
# Run on opening the page:
# - a fold's head (app.web.tabs.shared.fold) opens and closes it; grpoOpenFold(element) opens the fold around one.
# - a running run's clocks (.clock, app.web.views.run.clock_html: its elapsed time in the Run tab and the Runs table)
#   count on every second from the seconds the server drew, while they are shown: the server draws the view again
#   only when the store changes, not to move a clock.
# - the Run tab's log (#run-log) stays scrolled to its newest line unless the reader scrolled up; scrolled back to
#   the bottom, or shown another run's log, it follows again. Checked every 250 ms, which also catches the log
#   growing while its tab was hidden.
# - a token's tooltip (data-tip on .token and .step-end) shows at once on hover in one #token-tip box in the body,
#   placed by the token's place in the window (getBoundingClientRect): below it, or above it near the window's
#   bottom, moved left to stay inside the window; a scroll hides it. (A CSS ::after box lands at the token's
#   place in the page, off screen once the cards are scrolled into view.)
# - a chart drawn while its tab was hidden (a tick, a deleted run leaving the Compare picker) is drawn at plotly's
#   default 700 px: each plotly chart is resized to its place whenever its size changes, as when its tab shows.
DASHBOARD_JS = """() => {
  window.grpoOpenFold = (el) => el?.closest('.fold')?.querySelector('.fold-toggle')?.setAttribute('aria-expanded', 'true');
  document.addEventListener('click', (e) => {
    const head = e.target instanceof Element && e.target.closest('.fold-toggle');
    if (head) head.setAttribute('aria-expanded', head.getAttribute('aria-expanded') === 'true' ? 'false' : 'true');
  });
  const atBottom = (t) => t.scrollTop + t.clientHeight >= t.scrollHeight - 4;
  document.addEventListener('scroll', (e) => {
    const t = e.target;
    if (t instanceof HTMLTextAreaElement && t.closest('#run-log') && t.clientHeight) {
      t.dataset.follow = atBottom(t) ? '1' : '0';
    }
  }, true);
  const durationText = (seconds) => {
    const s = Math.max(0, Math.round(seconds)), d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600);
    const m = Math.floor(s % 3600 / 60), two = (n) => String(n).padStart(2, '0');
    return d ? `${d}d ${two(h)}h` : h ? `${h}h ${two(m)}m` : m ? `${m}m ${two(s % 60)}s` : `${s % 60}s`;
  };
  setInterval(() => {
    const now = performance.now();
    for (const clock of document.querySelectorAll('.clock[data-elapsed]')) {
      if (!clock.dataset.seen) clock.dataset.seen = String(now);
      if (!clock.offsetParent) continue;
      const seconds = Number(clock.dataset.elapsed) + (now - Number(clock.dataset.seen)) / 1000;
      const text = clock.dataset.prefix + durationText(seconds);
      if (clock.textContent !== text) clock.textContent = text;
    }
  }, 1000);
  setInterval(() => {
    const t = document.querySelector('#run-log textarea');
    if (!t || !t.clientHeight) return;
    const tail = t.value.slice(-120);
    if (t.dataset.tail && !t.value.includes(t.dataset.tail)) t.dataset.follow = '1';
    t.dataset.tail = tail;
    if (t.dataset.follow !== '0' && !atBottom(t)) t.scrollTop = t.scrollHeight;
  }, 250);
  const tip = document.createElement('div');
  tip.id = 'token-tip';
  tip.setAttribute('role', 'tooltip');
  document.body.appendChild(tip);
  const hide = () => { tip.style.display = 'none'; };
  document.addEventListener('mouseover', (e) => {
    const el = e.target instanceof Element && e.target.closest('.token[data-tip], .step-end[data-tip]');
    if (!el) return hide();
    tip.textContent = el.dataset.tip;
    tip.style.display = 'block';
    const r = el.getBoundingClientRect(), gap = 6, edge = 8;
    const w = tip.offsetWidth, h = tip.offsetHeight;
    const below = r.bottom + gap + h <= window.innerHeight - edge;
    tip.style.top = `${below ? r.bottom + gap : Math.max(edge, r.top - gap - h)}px`;
    tip.style.left = `${Math.max(edge, Math.min(r.left, window.innerWidth - edge - w))}px`;
  });
  document.addEventListener('scroll', hide, true);
  setTimeout(() => window.grpoEndStrayTimers && window.grpoEndStrayTimers(), 1000);
  const shown = new ResizeObserver((entries) => {
    for (const entry of entries) if (entry.contentRect.width > 0 && window.Plotly) window.Plotly.Plots.resize(entry.target);
  });
  const watch = (node) => {
    if (!(node instanceof Element)) return;
    for (const plot of node.matches('.js-plotly-plot') ? [node] : node.querySelectorAll('.js-plotly-plot')) shown.observe(plot);
  };
  watch(document.body);
  new MutationObserver((changes) => changes.forEach((c) => c.addedNodes.forEach(watch)))
    .observe(document.body, {childList: true, subtree: true});
}"""


def build_ui(login: bool = False) -> gr.Blocks:
    """The dashboard's Blocks: tabs, listeners, a refresh timer (app.web.tabs.shared.tick) and the named endpoints;
    with ``login``, a "Log out" button in the header.

    Everything shown is read from the store (through app.service.api) on every refresh, so reloading the page
    or restarting the server shows the same runs, charts and groups.
    """
    # Gradio keeps a copy of every uploaded and returned file: those older than an hour are deleted every hour
    with gr.Blocks(title="GRPO dashboard", analytics_enabled=False, delete_cache=(3600, 3600)) as demo:
        with gr.Row(elem_id="header"):
            gr.Markdown(
                "## GRPO dashboard\nLaunch Group Relative Policy Optimization runs, "
                "watch them train, and look at every sampled group's per-token advantages."
            )
            if login:
                gr.Button("Log out", size="sm", variant="secondary", scale=0, min_width=90, elem_id="logout").click(
                    None, js=LOGOUT_JS
                )
        with gr.Tabs(selected="runs", elem_id="tabs") as tabs:
            shared = make_shared(demo, tabs)
            launch = build_launch_tab(shared)
            build_runs_tab(shared)
            build_run_tab(shared, launch)
            build_groups_tab(shared)
            build_compare_tab(shared)
        shared.timer.render()
        shared.store_seen.render()
        shared.timer.tick(tick, shared.store_seen, [shared.store_seen, shared.timer], **QUIET)
        _keep_run_pickers_in_sync(shared)
        for fn in ENDPOINTS:
            gr.api(fn, api_name=fn.__name__, concurrency_limit=ENDPOINT_CONCURRENCY)
    return demo


def _keep_run_pickers_in_sync(shared: Shared) -> None:
    """A run picked in the Run tab is the Groups tab's run too, and the other way round."""
    shared.run_select.input(lambda v: v, shared.run_select, shared.groups_run_select, **PRIVATE)
    shared.groups_run_select.input(lambda v: v, shared.groups_run_select, shared.run_select, **PRIVATE)


async def _login(user: str, password: str) -> bool:
    """Gradio's login check, off the event loop: a PBKDF2 hash takes a good fraction of a second, and the
    server keeps answering other requests meanwhile."""
    return await asyncio.to_thread(auth.check, user, password)


def serve(host: str = "127.0.0.1", port: int = 7860) -> None:
    """Bring the store's schema up to date and serve the dashboard (blocks until stopped).

    With users configured (GRPO_AUTH_USERS / GRPO_AUTH_FILE) the page and every API route need a login;
    a malformed entry stops the start (app.core.auth.AuthConfigError, naming where it is). Uploads larger than
    GRPO_MAX_MODEL_UPLOAD_MB or GRPO_MAX_UPLOAD_MB, whichever is larger, are refused by Gradio before they are
    written. The models folder is created, and what uploads left half-written there more than an hour ago is
    removed. The Gradio app is mounted in a parent app
    whose middleware (app.web.guards.security) refuses other origins, sets the security headers and guards logins.
    """
    settings = get_settings()
    users = auth.load_users(settings)
    upgrade_database()
    settings.models_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(settings.models_dir)
    if users:
        print(
            f"grpo-dashboard: login required; {len(users)} user{'s' if len(users) != 1 else ''} may log in", flush=True
        )
    else:
        print("grpo-dashboard: no login required (set GRPO_AUTH_USERS or GRPO_AUTH_FILE to require one)", flush=True)
    app = make_app(settings, login=bool(users))
    print(f"grpo-dashboard: serving on http://{host}:{port}", flush=True)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=SHUTDOWN_SECONDS)
    _Server(config, on_exit=_gradio_app(app).stop_event.set).run()


def _gradio_app(parent: FastAPI):
    """The Gradio app mounted in ``parent``."""
    return next(route.app for route in parent.routes if isinstance(route, Mount))


class _Server(uvicorn.Server):
    """uvicorn's server, which on SIGTERM or Ctrl-C first tells Gradio to end its event streams (heartbeats to
    browsers and clients, which never end by themselves), so the server stops at once."""

    def __init__(self, config: uvicorn.Config, on_exit):
        super().__init__(config)
        self.on_exit = on_exit

    def handle_exit(self, sig, frame) -> None:
        self.on_exit()
        super().handle_exit(sig, frame)


def make_app(settings: Settings, login: bool) -> FastAPI:
    """The dashboard as an ASGI app: the Gradio app mounted at / in a parent app with the CORS policy (only
    GRPO_ALLOWED_ORIGINS get CORS headers) and app.web.guards.security's middleware outermost."""
    parent = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    # Gradio's queue rebuilds a pandas table of its last GRADIO_ANALYTICS_MAX_EVENTS (10,000) calls after every
    # call, for a monitoring page the dashboard does not enable: at 40 calls/s that table costs tens of ms per
    # call. Compute it once at most, over a few calls.
    os.environ.setdefault("GRADIO_ANALYTICS_CACHE_FREQUENCY", str(10**9))
    os.environ.setdefault("GRADIO_ANALYTICS_MAX_EVENTS", "100")
    # Gradio tries `import matplotlib` around every call; where it is not installed, each failed import searches
    # the whole path again. Record it as absent once.
    if importlib.util.find_spec("matplotlib") is None:
        sys.modules.setdefault("matplotlib", None)
    css = "\n".join(path.read_text(encoding="utf-8") for path in CSS_PATHS)
    gr.mount_gradio_app(
        parent,
        build_ui(login).queue(),
        path="/",
        show_error=False,
        auth=_login if login else None,
        max_file_size=settings.largest_upload_bytes,  # a model's cap or a dataset's; each endpoint checks its own
        css=css,
        js=DASHBOARD_JS,
    )
    mounted = _gradio_app(parent)
    parent.add_middleware(
        CORSMiddleware,
        allow_origins=list(settings.allowed_origins),
        allow_credentials=True,
        allow_methods=["*"],
        allow_headers=["*"],
    )
    parent.add_middleware(
        SecurityMiddleware, settings=settings, gradio_app=lambda: mounted, login=login, page_head=HEAD_JS
    )
    return parent
