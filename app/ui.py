"""The dashboard: a Gradio app with four tabs and the named API endpoints.

Tabs: Launch (the run-spec form), Runs (every run, refreshed every 2 s), Run (progress,
ETA, live charts, cancel, config, log) and Groups (the G completions of a sampled group,
each token coloured by its advantage).

The named endpoints (``/launch_run``, ``/list_runs``, ``/get_run``, ``/get_metrics``,
``/list_groups``, ``/get_group``, ``/cancel_run``) wrap app.api one to one and are what
``gradio_client`` calls; the UI's own listeners are private, so the API page lists only those.

This module imports no torch: the run is sent to the workers by task name (app.api).
No ``from __future__ import annotations`` here: gr.api reads the endpoint signatures' types.
"""
import html
from datetime import datetime, timezone

import gradio as gr
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app import api
from app.db import upgrade_database
from grpo_engine.config import FIELDS

REFRESH_SECONDS = 2.0
RUN_COLUMNS = ["id", "name", "status", "model", "dataset", "step", "created (UTC)"]
GROUP_COLUMNS = ["group", "prompt", "reward mean", "reward std"]
CHARTS = (("reward_mean", "reward (mean)"), ("eval/accuracy", "eval accuracy (greedy)"),
          ("kl", "KL to reference (k3)"), ("loss", "loss"))
PRIVATE = dict(api_visibility="private")  # the UI's own listeners: not part of the API
QUIET = dict(api_visibility="private", show_progress="hidden")  # timer refreshes: no spinner

CSS = """
#launch-result .error, .run-error { color: #b91c1c; white-space: pre-wrap; }
#launch-result .ok { color: #15803d; }
.run-title { font-size: 1.1em; margin-bottom: 6px; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 0.85em;
         color: #fff; background: #6b7280; margin-right: 6px; }
.badge.queued { background: #6b7280; } .badge.running { background: #2563eb; }
.badge.completed { background: #15803d; } .badge.failed { background: #b91c1c; }
.badge.cancelled { background: #a16207; }
.progress-track { height: 14px; border-radius: 7px; background: #e5e7eb; overflow: hidden; }
.progress-fill { height: 100%; background: #2563eb; transition: width 0.5s; }
.progress-fill.completed { background: #15803d; } .progress-fill.failed { background: #b91c1c; }
.progress-fill.cancelled { background: #a16207; }
.progress-text { margin-top: 4px; font-variant-numeric: tabular-nums; }
.group-head { margin-bottom: 8px; } .group-head pre { white-space: pre-wrap; margin: 2px 0 6px; }
.adv-legend { display: inline-block; width: 180px; height: 10px; vertical-align: middle; margin: 0 6px;
              background: linear-gradient(to right, rgb(220,38,38), #fff, rgb(22,163,74));
              border: 1px solid #d1d5db; }
.sample { border: 1px solid #d1d5db; border-radius: 6px; padding: 6px 8px; margin: 6px 0; }
.sample-head { font-size: 0.9em; margin-bottom: 4px; }
.tokens { font-family: ui-monospace, monospace; font-size: 0.9em; line-height: 1.9; }
.token { color: #111; padding: 1px 0; border-radius: 2px; white-space: pre; }
.token.strong { color: #fff; }
.token .ws { opacity: 0.45; }
.step-end { font-size: 0.75em; color: #fff; background: #4b5563; border-radius: 3px;
            padding: 0 4px; margin: 0 4px; }
"""


# ---- named API endpoints (gradio_client): app.api with gr.Error for refused input ----

def _call(fn, *args):
    """Run an api function; an ApiError reaches the client as gr.Error with its message."""
    try:
        return fn(*args)
    except api.ApiError as e:
        raise gr.Error(str(e), print_exception=False) from None


def launch_run(spec: dict) -> dict:
    """Launch a run from a run spec (JSON object; missing keys take their defaults). Returns {run_id, status}."""
    return _call(api.launch_run, spec)


def list_runs() -> list[dict]:
    """Every run, newest first."""
    return _call(api.list_runs)


def get_run(run_id: int) -> dict:
    """One run: status, config, step / total_steps, error, timestamps."""
    return _call(api.get_run, run_id)


def get_metrics(run_id: int) -> list[dict]:
    """Per-step metrics of a run, ordered by step."""
    return _call(api.get_metrics, run_id)


def list_groups(run_id: int, step: int | None = None) -> list[dict]:
    """Groups sampled at a step (default: the latest step that has groups)."""
    return _call(api.list_groups, run_id, step)


def get_group(group_id: int) -> dict:
    """One group: prompt, reference and its samples with tokens, rewards and per-token advantages."""
    return _call(api.get_group, group_id)


def cancel_run(run_id: int) -> dict:
    """Cancel a run (queued: at once; running: at the next step). Returns {run_id, status}."""
    return _call(api.cancel_run, run_id)


ENDPOINTS = (launch_run, list_runs, get_run, get_metrics, list_groups, get_group, cancel_run)


# ---- rendering: plain functions from API dicts to table rows, HTML and figures ----

def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    t = datetime.fromisoformat(value)
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def _duration(seconds: float) -> str:
    seconds = int(round(max(seconds, 0)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h {m:02d}m" if h else f"{m}m {s:02d}s" if m else f"{s}s"


def runs_frame(runs: list[dict]) -> pd.DataFrame:
    """The Runs table: one row per run, newest first."""
    rows = [[r["run_id"], r["name"], r["status"], r["model"], r["dataset"],
             f"{r['step']}/{r['total_steps']}", (r["created_at"] or "")[:19].replace("T", " ")]
            for r in runs]
    return pd.DataFrame(rows, columns=RUN_COLUMNS)


def run_choices(runs: list[dict]) -> list[tuple[str, int]]:
    """Dropdown entries: ('#12 name (status)', 12)."""
    return [(f"#{r['run_id']} {r['name']} ({r['status']})", r["run_id"]) for r in runs]


def progress_html(run: dict, now: datetime | None = None) -> str:
    """Status badge, progress bar, percentage, elapsed time and ETA; the error of a failed run."""
    now = now or datetime.now(timezone.utc)
    status, step, total = run["status"], run["step"] or 0, run["total_steps"] or 0
    pct = 100.0 * step / total if total else 0.0
    started, finished = _parse_time(run.get("started_at")), _parse_time(run.get("finished_at"))
    parts = [f"step {step} / {total}", f"{pct:.0f}%"]
    if status == "queued":
        parts.append("waiting for a worker")
    elif started and status == "running":
        elapsed = (now - started).total_seconds()
        parts.append(f"elapsed {_duration(elapsed)}")
        # ETA: the average time per finished step so far, times the steps left
        parts.append(f"ETA {_duration(elapsed / step * (total - step))}" if step else "ETA: estimating")
        if run.get("cancel_requested"):
            parts.append("cancelling at the next step")
    elif started and finished:
        parts.append(f"ran {_duration((finished - started).total_seconds())}")
    error = f'<pre class="run-error">{html.escape(run["error"])}</pre>' if run.get("error") else ""
    return (
        f'<div class="run-progress" data-status="{status}" data-step="{step}" data-total="{total}">'
        f'<div class="run-title"><span class="badge {status}">{status}</span>'
        f'<b>#{run["run_id"]}</b> {html.escape(run["name"])}</div>'
        f'<div class="progress-track"><div class="progress-fill {status}" style="width:{pct:.1f}%"></div></div>'
        f'<div class="progress-text">{" · ".join(parts)}</div>{error}</div>'
    )


def metrics_figure(metrics: list[dict]) -> go.Figure:
    """Four small charts over steps: mean reward, eval accuracy, KL and loss."""
    fig = make_subplots(rows=2, cols=2, subplot_titles=[title for _, title in CHARTS],
                        horizontal_spacing=0.08, vertical_spacing=0.16)
    for i, (key, title) in enumerate(CHARTS):
        points = [(m["step"], m[key]) for m in metrics if m.get(key) is not None]
        row, col = i // 2 + 1, i % 2 + 1
        fig.add_trace(go.Scatter(x=[p[0] for p in points], y=[p[1] for p in points], name=title,
                                 mode="lines+markers" if len(points) < 40 else "lines"), row=row, col=col)
        if not points:
            fig.add_annotation(text="no data yet", showarrow=False, font=dict(color="#9ca3af"),
                               x=0.5, y=0.5, xref="x domain", yref="y domain", row=row, col=col)
            fig.update_xaxes(showticklabels=False, row=row, col=col)
            fig.update_yaxes(showticklabels=False, row=row, col=col)
    fig.update_xaxes(title_text="step", row=2)
    fig.update_layout(height=480, showlegend=False, template="plotly_white",
                      margin=dict(l=40, r=20, t=40, b=40))
    return fig


def groups_frame(groups: list[dict]) -> pd.DataFrame:
    """The group list of one step: id, prompt (first line, shortened), reward mean and std."""
    def short(text: str) -> str:
        line = " ".join(text.split())
        return line if len(line) <= 90 else line[:87] + "..."
    rows = [[g["group_id"], short(g["prompt"]), round(g["reward_mean"], 4), round(g["reward_std"], 4)]
            for g in groups]
    return pd.DataFrame(rows, columns=GROUP_COLUMNS)


def _visible(token: str) -> str:
    """HTML for a token's text: escaped, with spaces, tabs and newlines drawn as marks."""
    if token == "":
        return '<span class="ws">∅</span>'
    text = html.escape(token)
    return (text.replace(" ", '<span class="ws">·</span>')
                .replace("\t", '<span class="ws">→</span>')
                .replace("\r", '<span class="ws">␍</span>')
                .replace("\n", '<span class="ws">↵</span>'))


def token_span(token: str, advantage: float, scale: float) -> str:
    """One token on a background from white (A = 0) to red (A < 0) or green (A > 0).

    The intensity is |A| / scale, where scale is the largest |A| in the group.
    """
    f = min(abs(advantage) / scale, 1.0) if scale > 0 else 0.0
    target = (220, 38, 38) if advantage < 0 else (22, 163, 74)
    r, g, b = (round(255 + (c - 255) * f) for c in target)
    strong = " strong" if f > 0.6 else ""
    title = html.escape(f"{token!r}  A = {advantage:+.4f}", quote=True)
    return (f'<span class="token{strong}" data-adv="{advantage:.6g}" title="{title}" '
            f'style="background:rgb({r},{g},{b})">{_visible(token)}</span>')


def group_html(group: dict) -> str:
    """The prompt, the reference and each of the G completions as advantage-coloured tokens."""
    samples = group["samples"]
    scale = max((abs(a) for s in samples for a in s["advantages"]), default=0.0)
    rewards = [s["reward"] for s in samples]
    mean = sum(rewards) / len(rewards) if rewards else 0.0
    out = [
        f'<div class="group" data-group-id="{group["group_id"]}">',
        '<div class="group-head">',
        f'<b>Group {group["group_id"]}</b> · run {group["run_id"]} · step {group["step"]} · '
        f'{len(samples)} samples · reward mean {mean:.3f}',
        f'<div>Prompt:</div><pre class="prompt">{html.escape(group["prompt"])}</pre>',
        f'<div>Reference: <code>{html.escape(str(group.get("reference") or ""))}</code></div>',
        f'<div>Advantage: {-scale:+.3f}<span class="adv-legend"></span>{scale:+.3f} '
        '(hover a token for its value)</div></div>',
    ]
    for i, sample in enumerate(samples):
        ends = sample.get("step_end_indices") or []
        step_rewards = sample.get("step_rewards") or []
        end_at = {t: k for k, t in enumerate(ends)}
        spans = []
        for t, (token, adv) in enumerate(zip(sample["tokens"], sample["advantages"])):
            spans.append(token_span(token, adv, scale))
            if t in end_at:
                k = end_at[t]
                r = f" r={step_rewards[k]:+.2f}" if k < len(step_rewards) else ""
                spans.append(f'<span class="step-end">step {k + 1}{r}</span>')
            spans.append("<br>" * token.count("\n"))  # the line break after the token and its step mark
        components = ", ".join(f"{html.escape(k)} {v:g}" for k, v in (sample.get("reward_components") or {}).items())
        out.append(
            f'<div class="sample" data-sample-id="{sample["sample_id"]}" data-reward="{sample["reward"]:.6g}">'
            f'<div class="sample-head"><b>sample {i + 1}</b> · reward <b>{sample["reward"]:+.3f}</b>'
            f'{" (" + components + ")" if components else ""} · {len(sample["tokens"])} tokens</div>'
            f'<div class="tokens">{"".join(spans)}</div></div>'
        )
    out.append("</div>")
    return "".join(out)


# ---- the app ----

def build_ui() -> gr.Blocks:
    """The dashboard's Blocks: tabs, listeners, a 2 s refresh timer and the named endpoints."""
    with gr.Blocks(title="GRPO dashboard", analytics_enabled=False) as demo:
        gr.Markdown("## GRPO dashboard\nLaunch Group Relative Policy Optimization runs, "
                    "watch them train, and look at every sampled group's per-token advantages.")
        with gr.Tabs(selected="runs", elem_id="tabs") as tabs:
            # 1. Launch: one input per run-spec field, with its default and its help
            with gr.Tab("Launch", id="launch", elem_id="tab-launch"):
                form = []
                for start in range(0, len(FIELDS), 3):
                    with gr.Row():
                        for field in FIELDS[start:start + 3]:
                            form.append(_field_input(field))
                launch_button = gr.Button("Launch", variant="primary", elem_id="launch-button")
                launch_result = gr.HTML(elem_id="launch-result")

            # 2. Runs: the table; click a row to open the run
            with gr.Tab("Runs", id="runs", elem_id="tab-runs"):
                runs_table = gr.Dataframe(runs_frame([]), interactive=False, elem_id="runs-table",
                                          label="Runs (newest first; click a row to open it)")

            # 3. Run: progress, charts, cancel, config and log
            with gr.Tab("Run", id="run", elem_id="tab-run"):
                with gr.Row():
                    run_select = gr.Dropdown([], value=None, label="Run", elem_id="run-select")
                    cancel_button = gr.Button("Cancel run", variant="stop", elem_id="cancel-button",
                                              scale=0, min_width=160)
                progress = gr.HTML(elem_id="run-progress")
                charts = gr.Plot(label="Metrics", elem_id="run-charts")
                with gr.Row():
                    config_view = gr.JSON(label="Config", elem_id="run-config")
                    log_view = gr.Textbox(label="Log", lines=14, max_lines=14, interactive=False,
                                          elem_id="run-log")

            # 4. Groups: pick a step, then a group; tokens coloured by advantage
            with gr.Tab("Groups", id="groups", elem_id="tab-groups"):
                with gr.Row():
                    groups_run_select = gr.Dropdown([], value=None, label="Run", elem_id="groups-run-select")
                    step_select = gr.Dropdown([], value=None, label="Step (follows the latest)",
                                              elem_id="group-step")
                groups_table = gr.Dataframe(groups_frame([]), interactive=False, elem_id="groups-table",
                                            label="Groups at this step (click a row to show it)")
                group_view = gr.HTML(elem_id="group-view")

        runs_seen = gr.State(None)  # the last rows shown in the Runs table
        chart_seen = gr.State(None)  # (run_id, metric rows, log lines) last drawn
        steps_seen = gr.State(None)  # (run_id, group steps) last offered
        timer = gr.Timer(REFRESH_SECONDS)

        # -- runs list: table and both run pickers
        def refresh_runs(seen, run_id, groups_run_id):
            runs = api.list_runs()
            frame = runs_frame(runs)
            rows = frame.values.tolist()
            if rows == seen and (run_id is not None or not rows):
                return gr.skip(), gr.skip(), gr.skip(), seen
            newest = runs[0]["run_id"] if runs else None
            choices = run_choices(runs)
            return (frame,
                    gr.Dropdown(choices=choices, value=run_id if run_id is not None else newest),
                    gr.Dropdown(choices=choices, value=groups_run_id if groups_run_id is not None else newest),
                    rows)

        runs_outputs = [runs_table, run_select, groups_run_select, runs_seen]
        runs_inputs = [runs_seen, run_select, groups_run_select]
        demo.load(refresh_runs, runs_inputs, runs_outputs, **PRIVATE)
        timer.tick(refresh_runs, runs_inputs, runs_outputs, **QUIET)

        def open_run(evt: gr.SelectData):
            run_id = int(evt.row_value[0])
            return gr.Tabs(selected="run"), run_id, run_id

        runs_table.select(open_run, None, [tabs, run_select, groups_run_select], **PRIVATE)
        run_select.input(lambda v: v, run_select, groups_run_select, **PRIVATE)
        groups_run_select.input(lambda v: v, groups_run_select, run_select, **PRIVATE)

        # -- launch
        def launch(*values):
            spec = {field.name: value for field, value in zip(FIELDS, values)}
            try:
                result = api.launch_run(spec)
            except api.ApiError as e:
                return (f'<div class="error">Not launched: {html.escape(str(e))}</div>',
                        gr.skip(), gr.skip(), gr.skip())
            runs = api.list_runs()
            run_id = result["run_id"]
            choices = run_choices(runs)
            return (f'<div class="ok">Launched run {run_id} ({result["status"]}).</div>',
                    gr.Tabs(selected="run"),
                    gr.Dropdown(choices=choices, value=run_id),
                    gr.Dropdown(choices=choices, value=run_id))

        launch_button.click(launch, form, [launch_result, tabs, run_select, groups_run_select], **PRIVATE)

        # -- run view: redrawn when the run changes and on every tick
        def show_run(run_id, seen):
            if run_id is None:
                return "<div>No run selected.</div>", None, None, "", None
            try:
                run, metrics, logs = api.get_run(run_id), api.get_metrics(run_id), api.get_logs(run_id)
            except api.ApiError as e:
                return f'<div class="run-error">{html.escape(str(e))}</div>', None, None, "", None
            key = (run_id, len(metrics), metrics[-1]["step"] if metrics else None, len(logs),
                   logs[-1] if logs else None)
            if seen is not None and key == tuple(seen):
                return progress_html(run), gr.skip(), gr.skip(), gr.skip(), seen
            same_run = seen is not None and seen[0] == run_id
            return (progress_html(run), metrics_figure(metrics),
                    gr.skip() if same_run else run["config"], "\n".join(logs), list(key))

        run_outputs = [progress, charts, config_view, log_view, chart_seen]
        run_select.change(show_run, [run_select, chart_seen], run_outputs, **PRIVATE)
        timer.tick(show_run, [run_select, chart_seen], run_outputs, **QUIET)

        def cancel(run_id):
            if run_id is None:
                return "<div>No run selected.</div>"
            try:
                api.cancel_run(run_id)
                return progress_html(api.get_run(run_id))
            except api.ApiError as e:
                return f'<div class="run-error">{html.escape(str(e))}</div>'

        cancel_button.click(cancel, run_select, progress, **PRIVATE)

        # -- group browser: the step list follows the latest step unless an older one is picked
        def refresh_steps(run_id, step, seen):
            if run_id is None:
                return gr.Dropdown(choices=[], value=None), None
            try:
                steps = api.group_steps(run_id)
            except api.ApiError:
                return gr.Dropdown(choices=[], value=None), None
            if seen is not None and seen[0] == run_id and seen[1] == steps:
                return gr.skip(), seen
            following = seen is None or seen[0] != run_id or step is None or step == max(seen[1], default=None)
            value = (steps[-1] if steps else None) if following or step not in steps else step
            return gr.Dropdown(choices=[(f"step {s}", s) for s in steps], value=value), [run_id, steps]

        steps_io = ([groups_run_select, step_select, steps_seen], [step_select, steps_seen])
        groups_run_select.change(refresh_steps, *steps_io, **PRIVATE)
        timer.tick(refresh_steps, *steps_io, **QUIET)

        def show_step(run_id, step):
            if run_id is None or step is None:
                return groups_frame([]), "<div>No groups recorded yet.</div>"
            try:
                groups = api.list_groups(run_id, step)
                first = api.get_group(groups[0]["group_id"]) if groups else None
            except api.ApiError as e:
                return groups_frame([]), f'<div class="run-error">{html.escape(str(e))}</div>'
            return groups_frame(groups), group_html(first) if first else "<div>No groups at this step.</div>"

        step_select.change(show_step, [groups_run_select, step_select], [groups_table, group_view], **PRIVATE)

        def show_group(evt: gr.SelectData):
            try:
                return group_html(api.get_group(evt.row_value[0]))
            except api.ApiError as e:
                return f'<div class="run-error">{html.escape(str(e))}</div>'

        groups_table.select(show_group, None, group_view, **PRIVATE)

        # -- the named API endpoints
        for fn in ENDPOINTS:
            gr.api(fn, api_name=fn.__name__)
    return demo


def _field_input(field):
    """The form input of one run-spec field: radio for choices, text for strings, else a number."""
    if field.choices:
        return gr.Radio(list(field.choices), value=field.default, label=field.name, info=field.help,
                        elem_id=f"spec-{field.name}")
    if field.type is str:
        return gr.Textbox(value=field.default, label=field.name, info=field.help, elem_id=f"spec-{field.name}")
    # no min/max/precision on the component: validate_spec is the one judge and names the key
    return gr.Number(value=field.default, label=field.name, info=field.help, elem_id=f"spec-{field.name}")


def serve(host: str = "127.0.0.1", port: int = 7860) -> None:
    """Bring the store's schema up to date and serve the dashboard (blocks until stopped)."""
    upgrade_database()
    build_ui().queue().launch(server_name=host, server_port=port, show_error=True, css=CSS)
