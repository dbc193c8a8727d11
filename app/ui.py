"""The dashboard: a Gradio app with five tabs and the named API endpoints.

Tabs: Launch (the run-spec form), Runs (every run, refreshed every 2 s), Run (progress with
iteration and ETA, live charts of every metric, reward-model refreshes, cancel, export, launch
again, config, log), Groups (a step's groups, sortable; the G completions of one side by side,
each token coloured by its advantage) and Compare (several runs' curves and configs).

The named endpoints (``/launch_run``, ``/list_runs``, ``/get_run``, ``/get_metrics``,
``/list_groups``, ``/get_group``, ``/cancel_run``, ``/compare_runs``, ``/export_run``,
``/upload_dataset``, ``/preview_dataset``) wrap app.api one to one and are what
``gradio_client`` calls; the UI's own listeners are private, so the API page lists only those.
With users configured (app.auth) the page and every endpoint need a login.

This module imports no torch: the run is sent to the workers by task name (app.api).
No ``from __future__ import annotations`` here: gr.api reads the endpoint signatures' types.
"""
import asyncio
import html
from datetime import datetime, timezone
from pathlib import Path

import gradio as gr
import gradio.utils
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app import api, auth
from app.db import upgrade_database
from app.settings import get_settings
from grpo_engine.config import FIELDS
from grpo_engine.recorder import METRICS, RM_METRICS

REFRESH_SECONDS = 2.0
RUN_COLUMNS = ["id", "name", "status", "model", "dataset", "step", "created (UTC)"]
GROUP_COLUMNS = ["group", "prompt", "reward mean", "reward std"]
# The Run tab's chart panels: (title, metric names). A recorded metric in no panel goes to "other".
PANELS = (
    ("reward", ("reward_mean", "reward_std", "correct_frac", "zero_std_frac")),
    ("accuracy", ("eval/accuracy",)),
    ("KL and loss", ("kl", "loss")),
    ("clip and entropy", ("clip_frac", "entropy")),
    ("lengths", ("completion_len", "truncated_frac")),
    ("optimizer", ("grad_norm", "learning_rate")),
    ("timing (s)", ("time/sampling", "time/scoring", "time/update", "time/step", "time/eval")),
    ("reward model", ("rm/accuracy_before", "rm/accuracy_after", "rm/loss")),
)
RM_COLUMNS = ["iteration", "step", "rm/loss", "accuracy before", "accuracy after", "change", "examples", "replayed"]
GROUP_ORDERS = (("sampling order", "position"), ("reward spread (largest first)", "spread"),
                ("reward mean (highest first)", "mean"), ("reward mean (lowest first)", "mean_asc"))
ADV_EPS = 1e-4  # eps' of the outcome normalisation (GRPO_SPEC.md), to show normalised rewards
PRIVATE = dict(api_visibility="private")  # the UI's own listeners: not part of the API
QUIET = dict(api_visibility="private", show_progress="hidden")  # timer refreshes: no spinner

CSS = """
#launch-result .error, .run-error, #dataset-upload-info .error { color: #b91c1c; white-space: pre-wrap; }
#launch-result .ok, #dataset-upload-info .ok { color: #15803d; }
.upload-preview { border-collapse: collapse; font-size: 0.85em; margin-top: 4px; }
.upload-preview th, .upload-preview td { border: 1px solid #e5e7eb; padding: 1px 6px; text-align: left; }
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
.samples { display: grid; grid-template-columns: repeat(auto-fill, minmax(300px, 1fr)); gap: 8px; }
.samples .sample { margin: 0; }
.verdicts { margin-top: 2px; } .verdict.ok { color: #15803d; } .verdict.bad { color: #b91c1c; }
.rm-score { color: #7c3aed; margin-left: 6px; } .component { color: #4b5563; margin-left: 6px; }
.config-diff table { border-collapse: collapse; font-size: 0.9em; }
.config-diff th, .config-diff td { border: 1px solid #e5e7eb; padding: 2px 8px; text-align: left; }
.config-diff tr.diff { background: #fef3c7; font-weight: 600; }
.diff-note { margin-bottom: 6px; }
.step-end { font-size: 0.75em; color: #fff; background: #4b5563; border-radius: 3px;
            padding: 0 4px; margin: 0 4px; }
"""


# ---- named API endpoints (gradio_client): app.api with gr.Error for refused input ----

def _call(fn, *args):
    """Run an api function; an ApiError reaches the client as gr.Error with its message, any other error
    as gr.Error too (its traceback in the server's log); passwords in URLs are masked in both."""
    try:
        return fn(*args)
    except api.ApiError as e:
        raise gr.Error(auth.mask_secrets(str(e)), print_exception=False) from None
    except Exception as e:
        raise gr.Error(auth.mask_secrets(f"{type(e).__name__}: {e}")) from e


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


def list_groups(run_id: int, step: int | None = None, order: str | None = None) -> list[dict]:
    """Groups sampled at a step (default: the latest step that has groups), sorted by order:
    position (default), spread, mean or mean_asc."""
    return _call(api.list_groups, run_id, step, order)


def get_group(group_id: int) -> dict:
    """One group: prompt, reference and its samples with tokens, rewards and per-token advantages."""
    return _call(api.get_group, group_id)


def cancel_run(run_id: int) -> dict:
    """Cancel a run (queued: at once; running: at the next step). Returns {run_id, status}."""
    return _call(api.cancel_run, run_id)


def compare_runs(run_ids: list) -> dict:
    """Several runs side by side: {runs, differing_keys (config keys that differ), metrics: {"<run_id>": [...]}}."""
    return _call(api.compare_runs, run_ids)


def export_run(run_id: int, kind: str = "parquet") -> dict:
    """A run's export as a file: its recorded samples as 'parquet' or 'csv', its 'config' as JSON, or the
    trained policy of a completed run as a zip: 'model' (LoRA merged) or 'adapter' (LoRA adapter alone)."""
    path = _call(api.export_run, run_id, kind)
    return {"path": path, "orig_name": path.rsplit("/", 1)[-1], "meta": {"_type": "gradio.FileData"}}


def _is_upload(file) -> bool:
    """Whether ``file`` is Gradio's dict of a file uploaded to this server: a path in Gradio's upload folder.

    Anything else (a bare path, a dict naming another file on the server) would let a caller make the
    server read a file of its choosing.
    """
    if not isinstance(file, dict) or (file.get("meta") or {}).get("_type") != "gradio.FileData":
        return False
    path = file.get("path")
    folder = Path(gradio.utils.get_upload_folder()).resolve()
    return isinstance(path, str) and Path(path).resolve().is_relative_to(folder)


def upload_dataset(file: dict) -> dict:
    """Upload a dataset file (gradio_client: handle_file(path)): .jsonl, .csv or .parquet with 'question' and
    'answer' (and optional 'solution'). Returns {dataset: the stored path, for a run spec's dataset, rows, preview}."""
    if not _is_upload(file):
        raise gr.Error("file must be an uploaded file (gradio_client: handle_file(path))", print_exception=False)
    return _call(api.upload_dataset, file)


def preview_dataset(dataset: str, question_field: str | None = None, answer_field: str | None = None,
                    solution_field: str | None = None) -> dict:
    """The first rows of a dataset as a run reads it: 'builtin-arith' or a local file's path (inside the path
    roots), from the columns the *_field arguments name (default question, answer, solution). Returns
    {dataset, rows, preview}; a bad file is refused naming the file and line."""
    return _call(api.preview_dataset, dataset, question_field, answer_field, solution_field)


ENDPOINTS = (launch_run, list_runs, get_run, get_metrics, list_groups, get_group, cancel_run, compare_runs,
             export_run, upload_dataset, preview_dataset)


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
    """Status badge, progress bar, percentage, elapsed time and ETA, the worker (and attempt, after a
    resume) and the newest checkpoint; the error of a failed run."""
    now = now or datetime.now(timezone.utc)
    status, step, total = run["status"], run["step"] or 0, run["total_steps"] or 0
    pct = 100.0 * step / total if total else 0.0
    started, finished = _parse_time(run.get("started_at")), _parse_time(run.get("finished_at"))
    parts = [f"step {step} / {total}", f"{pct:.0f}%"]
    config = run.get("config") or {}
    iterations, per_iteration = config.get("iterations") or 1, config.get("steps_per_iteration") or total
    if iterations > 1 and per_iteration:
        iteration = min(iterations, max(1, -(-step // per_iteration)))  # the iteration of the current step
        parts.insert(0, f"iteration {iteration} / {iterations}")
    checkpoint = run.get("checkpoint_step")
    if status == "queued" and run.get("attempts"):  # it ran before: paused, or its worker died
        parts.append(f"waiting for a worker to resume it from {f'step {checkpoint}' if checkpoint else 'the start'}")
    elif status == "queued":
        parts.append("waiting for a worker")
    if status == "running" and run.get("worker"):
        parts.append(f"on {run['worker']}" + (f" (attempt {run['attempts']})" if (run.get("attempts") or 0) > 1 else ""))
    if checkpoint and status in ("running", "queued"):
        parts.append(f"checkpoint at step {checkpoint}")
    if started and status == "running":
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
    """Every recorded metric over steps, in panels (PANELS, then "other"), two panels a row."""
    recorded = {k for m in metrics for k, v in m.items() if v is not None} - {"step", "iteration"}
    known = {k for _, keys in PANELS for k in keys}
    panels = [(title, keys) for title, keys in PANELS] + [("other", tuple(sorted(recorded - known)))]
    panels = [(t, keys) for t, keys in panels if t != "other" or keys]
    rows = (len(panels) + 1) // 2
    fig = make_subplots(rows=rows, cols=2, subplot_titles=[t for t, _ in panels],
                        horizontal_spacing=0.08, vertical_spacing=0.3 / rows)
    for i, (title, keys) in enumerate(panels):
        row, col = i // 2 + 1, i % 2 + 1
        drawn = 0
        for key in keys:
            points = [(m["step"], m[key]) for m in metrics if m.get(key) is not None]
            if not points:
                continue
            drawn += 1
            fig.add_trace(go.Scatter(x=[p[0] for p in points], y=[p[1] for p in points], name=key,
                                     legendgroup=title, legendgrouptitle_text=title if drawn == 1 else None,
                                     mode="lines+markers" if len(points) < 40 else "lines"), row=row, col=col)
        if not drawn:
            fig.add_annotation(text="no data yet", showarrow=False, font=dict(color="#9ca3af"),
                               x=0.5, y=0.5, xref="x domain", yref="y domain", row=row, col=col)
            fig.update_xaxes(showticklabels=False, row=row, col=col)
            fig.update_yaxes(showticklabels=False, row=row, col=col)
    fig.update_xaxes(title_text="step", row=rows)
    fig.update_layout(height=230 * rows + 60, template="plotly_white", margin=dict(l=40, r=20, t=40, b=40),
                      legend=dict(groupclick="toggleitem", font=dict(size=10)))
    return fig


def rm_refresh_frame(metrics: list[dict]) -> pd.DataFrame:
    """One row per reward-model (re)training: at step 0 its first training, then each refresh."""
    rows = []
    for m in metrics:
        if m.get("rm/accuracy_after") is None:
            continue
        before, after = m.get("rm/accuracy_before"), m["rm/accuracy_after"]
        rows.append([m["iteration"], m["step"], _round(m.get("rm/loss")), _round(before), _round(after),
                     None if before is None else _round(after - before),
                     m.get("rm/train_examples"), m.get("rm/replayed")])
    return pd.DataFrame(rows, columns=RM_COLUMNS)


def _round(value, digits: int = 4):
    return None if value is None else round(float(value), digits)


def compare_figure(compared: dict, metric_keys: list[str]) -> go.Figure:
    """One panel per metric, every compared run a line in it (same colour for a run in every panel)."""
    metric_keys = metric_keys or ["reward_mean"]
    fig = make_subplots(rows=len(metric_keys), cols=1, subplot_titles=metric_keys, vertical_spacing=0.12)
    palette = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563", "#ca8a04")
    for j, run in enumerate(compared["runs"]):
        metrics = compared["metrics"][str(run["run_id"])]
        for i, key in enumerate(metric_keys):
            points = [(m["step"], m[key]) for m in metrics if m.get(key) is not None]
            fig.add_trace(go.Scatter(x=[p[0] for p in points], y=[p[1] for p in points],
                                     name=f"#{run['run_id']} {run['name']}", legendgroup=str(run["run_id"]),
                                     showlegend=i == 0, line=dict(color=palette[j % len(palette)]),
                                     mode="lines+markers" if len(points) < 40 else "lines"), row=i + 1, col=1)
    fig.update_xaxes(title_text="step", row=len(metric_keys))
    fig.update_layout(height=260 * len(metric_keys) + 80, template="plotly_white",
                      margin=dict(l=40, r=20, t=40, b=40))
    return fig


def config_diff_html(compared: dict) -> str:
    """The compared runs' configs as a table, one column per run; rows of differing keys highlighted."""
    runs, differing = compared["runs"], set(compared["differing_keys"])
    keys = sorted({k for r in runs for k in r["config"]})
    keys = sorted(keys, key=lambda k: (k not in differing, k))  # differing keys first
    head = "".join(f"<th>#{r['run_id']} {html.escape(r['name'])}</th>" for r in runs)
    body = []
    for k in keys:
        cls = ' class="diff"' if k in differing else ""
        cells = "".join(f"<td>{html.escape(str(r['config'].get(k, '')))}</td>" for r in runs)
        body.append(f'<tr{cls} data-key="{html.escape(k)}"><th>{html.escape(k)}</th>{cells}</tr>')
    note = (f"{len(differing)} key{'s' if len(differing) != 1 else ''} differ: {', '.join(sorted(differing))}"
            if differing else "The configs are the same.")
    return (f'<div class="config-diff"><div class="diff-note">{html.escape(note)}</div>'
            f'<table><tr><th>key</th>{head}</tr>{"".join(body)}</table></div>')


def groups_frame(groups: list[dict]) -> pd.DataFrame:
    """The group list of one step: id, prompt (first line, shortened), reward mean and std."""
    def short(text: str) -> str:
        line = " ".join(text.split())
        return line if len(line) <= 90 else line[:87] + "..."
    rows = [[g["group_id"], short(g["prompt"]), round(g["reward_mean"], 4), round(g["reward_std"], 4)]
            for g in groups]
    return pd.DataFrame(rows, columns=GROUP_COLUMNS)


def upload_preview_html(result: dict, uploaded: bool = True) -> str:
    """A dataset's path and row count, and its first rows (each cell cut to 60 characters): what an upload
    stored, or (``uploaded`` False) what the dataset field names."""
    def cell(text: str) -> str:
        return html.escape(text if len(text) <= 60 else text[:57] + "...")
    rows = "".join(f"<tr><td>{cell(r['question'])}</td><td>{cell(r['answer'])}</td><td>{cell(r['solution'])}</td></tr>"
                   for r in result["preview"])
    head = (f'Stored {result["rows"]} rows as {html.escape(result["dataset"])}' if uploaded
            else f'{html.escape(result["dataset"])}: {result["rows"]} rows; the first {len(result["preview"])}:')
    return (f'<div class="ok">{head}</div>'
            f'<table class="upload-preview"><tr><th>question</th><th>answer</th><th>solution</th></tr>{rows}</table>')


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


def _normalised(reward: float, rewards: list[float]) -> float:
    """(r - mean) / (std + eps'), population std; 0 when every reward is the same (GRPO_SPEC.md, outcome)."""
    mean = sum(rewards) / len(rewards)
    std = (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5
    return 0.0 if all(r == rewards[0] for r in rewards) else (reward - mean) / (std + ADV_EPS)


def _verdicts(components: dict) -> str:
    """The verifier's verdict and, where a learned reward model scored the output, its score beside it."""
    parts = []
    if "correct" in components:
        parts.append(f'<span class="verdict {"ok" if components["correct"] else "bad"}">verifier '
                     f'{"✓ correct" if components["correct"] else "✗ wrong"}</span>')
    if "rm_score" in components:
        parts.append(f'<span class="rm-score">RM {components["rm_score"]:.3f}</span>')
    rest = {k: v for k, v in components.items() if k not in ("correct", "rm_score")}
    parts += [f'<span class="component">{html.escape(k)} {v:g}</span>' for k, v in rest.items()]
    return " ".join(parts)


def group_html(group: dict) -> str:
    """The prompt, the reference and the G completions side by side, tokens coloured by advantage.

    Each completion shows its raw reward and, when one reward per output was normalised (outcome
    supervision), the normalised one; process supervision marks each step's end with its reward.
    """
    samples = group["samples"]
    scale = max((abs(a) for s in samples for a in s["advantages"]), default=0.0)
    rewards = [s["reward"] for s in samples]
    mean = sum(rewards) / len(rewards) if rewards else 0.0
    process = any(s.get("step_end_indices") is not None for s in samples)
    out = [
        f'<div class="group" data-group-id="{group["group_id"]}">',
        '<div class="group-head">',
        f'<b>Group {group["group_id"]}</b> · run {group["run_id"]} · step {group["step"]} · '
        f'{len(samples)} samples · reward mean {mean:.3f}'
        f'{" · process supervision: step rewards at each step end" if process else ""}',
        f'<div>Prompt:</div><pre class="prompt">{html.escape(group["prompt"])}</pre>',
        f'<div>Reference: <code>{html.escape(str(group.get("reference") or ""))}</code></div>',
        f'<div>Advantage: {-scale:+.3f}<span class="adv-legend"></span>{scale:+.3f} '
        '(hover a token for its value)</div></div><div class="samples">',
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
        if process:
            reward_text = f'reward <b>{sample["reward"]:+.3f}</b> (mean of {len(step_rewards)} step rewards)'
        else:
            reward_text = (f'reward <b>{sample["reward"]:+.3f}</b> · normalised '
                           f'<b class="norm">{_normalised(sample["reward"], rewards):+.3f}</b>')
        out.append(
            f'<div class="sample" data-sample-id="{sample["sample_id"]}" data-reward="{sample["reward"]:.6g}">'
            f'<div class="sample-head"><b>sample {i + 1}</b> · {reward_text} · {len(sample["tokens"])} tokens'
            f'<div class="verdicts">{_verdicts(sample.get("reward_components") or {})}</div></div>'
            f'<div class="tokens">{"".join(spans)}</div></div>'
        )
    out.append("</div></div>")
    return "".join(out)


# ---- the app ----

def _nearest_step(steps: list[int], value) -> int | None:
    """The recorded step a slider value stands for: the latest recorded step at or below it (else the first)."""
    if not steps:
        return None
    if value is None:
        return steps[-1]
    below = [s for s in steps if s <= value]
    return below[-1] if below else steps[0]


def build_ui() -> gr.Blocks:
    """The dashboard's Blocks: tabs, listeners, a 2 s refresh timer and the named endpoints.

    Everything shown is read from the store (through app.api) on every refresh, so reloading the page
    or restarting the server shows the same runs, charts and groups.
    """
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
                form_input = dict(zip((f.name for f in FIELDS), form))  # run-spec key -> its input
                with gr.Row():
                    dataset_upload = gr.File(label="Upload a dataset (.jsonl, .csv, .parquet): fills in 'dataset'",
                                             file_types=[".jsonl", ".csv", ".parquet"], elem_id="dataset-upload",
                                             height=90, scale=1)
                    upload_info = gr.HTML(elem_id="dataset-upload-info")
                launch_button = gr.Button("Launch", variant="primary", elem_id="launch-button")
                launch_result = gr.HTML(elem_id="launch-result")

            # 2. Runs: the table; click a row to open the run
            with gr.Tab("Runs", id="runs", elem_id="tab-runs"):
                runs_table = gr.Dataframe(runs_frame([]), interactive=False, elem_id="runs-table",
                                          label="Runs (newest first; click a row to open it)")

            # 3. Run: progress, charts, reward-model refreshes, cancel, export, launch again, config and log
            with gr.Tab("Run", id="run", elem_id="tab-run"):
                with gr.Row():
                    run_select = gr.Dropdown([], value=None, label="Run", elem_id="run-select")
                    cancel_button = gr.Button("Cancel run", variant="stop", elem_id="cancel-button",
                                              scale=0, min_width=140)
                    relaunch_button = gr.Button("Launch again", elem_id="relaunch-button", scale=0, min_width=140)
                progress = gr.HTML(elem_id="run-progress")
                charts = gr.Plot(label="Metrics", elem_id="run-charts")
                rm_table = gr.Dataframe(rm_refresh_frame([]), interactive=False, visible=False,
                                        label="Reward model: first training (step 0) and refresh after each iteration "
                                              "(held-out accuracy on fresh policy samples)", elem_id="rm-refreshes")
                with gr.Row():
                    export_parquet = gr.Button("Groups as Parquet", size="sm", elem_id="export-parquet")
                    export_csv = gr.Button("Groups as CSV", size="sm", elem_id="export-csv")
                    export_config = gr.Button("Config as JSON", size="sm", elem_id="export-config")
                    export_model = gr.Button("Trained policy", size="sm", elem_id="export-model")
                    export_adapter = gr.Button("LoRA adapter", size="sm", elem_id="export-adapter")
                    export_file = gr.File(label="Download", interactive=False, elem_id="export-file", height=60)
                with gr.Row():
                    config_view = gr.JSON(label="Config", elem_id="run-config")
                    log_view = gr.Textbox(label="Log", lines=14, max_lines=14, interactive=False,
                                          elem_id="run-log")

            # 4. Groups: pick a step (slider) and an order, then a group; tokens coloured by advantage
            with gr.Tab("Groups", id="groups", elem_id="tab-groups"):
                with gr.Row():
                    groups_run_select = gr.Dropdown([], value=None, label="Run", elem_id="groups-run-select")
                    step_slider = gr.Slider(0, 1, value=0, step=1, label="Step (at the right end: follows the latest)",
                                            elem_id="group-step")
                    group_order = gr.Dropdown(list(GROUP_ORDERS), value="position", label="Sort groups by",
                                              elem_id="group-order")
                groups_table = gr.Dataframe(groups_frame([]), interactive=False, elem_id="groups-table",
                                            label="Groups at this step (click a row to show it)")
                group_view = gr.HTML(elem_id="group-view")

            # 5. Compare: several runs' curves overlaid, and their configs with the differing keys marked
            with gr.Tab("Compare", id="compare", elem_id="tab-compare"):
                with gr.Row():
                    compare_select = gr.Dropdown([], value=[], multiselect=True, label="Runs", elem_id="compare-runs")
                    compare_metrics = gr.Dropdown(list(METRICS) + list(RM_METRICS), value=["reward_mean", "eval/accuracy"],
                                                  multiselect=True, label="Metrics", elem_id="compare-metrics")
                compare_plot = gr.Plot(label="Curves", elem_id="compare-charts")
                compare_config = gr.HTML(elem_id="compare-config")

        runs_seen = gr.State(None)  # the last rows shown in the Runs table
        chart_seen = gr.State(None)  # (run_id, metric rows, log lines) last drawn
        steps_seen = gr.State(None)  # (run_id, group steps) last offered
        timer = gr.Timer(REFRESH_SECONDS)

        # -- runs list: table and the run pickers
        def refresh_runs(seen, run_id, groups_run_id):
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

        runs_outputs = [runs_table, run_select, groups_run_select, compare_select, runs_seen]
        runs_inputs = [runs_seen, run_select, groups_run_select]
        demo.load(refresh_runs, runs_inputs, runs_outputs, **PRIVATE)
        timer.tick(refresh_runs, runs_inputs, runs_outputs, **QUIET)

        def open_run(evt: gr.SelectData):
            run_id = int(evt.row_value[0])
            return gr.Tabs(selected="run"), run_id, run_id

        runs_table.select(open_run, None, [tabs, run_select, groups_run_select], **PRIVATE)
        run_select.input(lambda v: v, run_select, groups_run_select, **PRIVATE)
        groups_run_select.input(lambda v: v, groups_run_select, run_select, **PRIVATE)

        # -- launch, and launch again (the form pre-filled from a past run's config)
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

        def upload(path):
            if not path:
                return gr.skip(), ""
            try:
                result = api.upload_dataset(path)
            except api.ApiError as e:
                return gr.skip(), f'<div class="error">Not stored: {html.escape(str(e))}</div>'
            return result["dataset"], upload_preview_html(result)

        dataset_box = form_input["dataset"]
        dataset_upload.upload(upload, dataset_upload, [dataset_box, upload_info], **PRIVATE)

        def preview(dataset, *fields):
            try:
                return upload_preview_html(api.preview_dataset(dataset, *fields), uploaded=False)
            except api.ApiError as e:
                return f'<div class="error">{html.escape(str(e))}</div>'

        field_boxes = [form_input[k] for k in ("question_field", "answer_field", "solution_field")]
        for event in (dataset_box.blur, dataset_box.submit, *(box.blur for box in field_boxes)):  # typed in: the first rows
            event(preview, [dataset_box, *field_boxes], upload_info, **PRIVATE)
        demo.load(preview, [dataset_box, *field_boxes], upload_info, **PRIVATE)  # the default dataset's rows on opening

        def relaunch(run_id):
            if run_id is None:
                return [gr.skip()] * len(form) + [gr.skip(), "<div>No run selected.</div>"]
            try:
                config = api.get_run(run_id)["config"]
            except api.ApiError as e:
                return [gr.skip()] * len(form) + [gr.skip(), f'<div class="error">{html.escape(str(e))}</div>']
            values = [config.get(f.name, f.default) for f in FIELDS]
            return values + [gr.Tabs(selected="launch"),
                             f'<div class="ok">The form holds the config of run {run_id}: change what you like, '
                             'then Launch.</div>']

        relaunch_button.click(relaunch, run_select, [*form, tabs, launch_result], **PRIVATE)

        # -- run view: redrawn when the run changes and on every tick
        def show_run(run_id, seen):
            if run_id is None:
                return "<div>No run selected.</div>", None, gr.Dataframe(visible=False), None, "", None
            try:
                run, metrics, logs = api.get_run(run_id), api.get_metrics(run_id), api.get_logs(run_id)
            except api.ApiError as e:
                return (f'<div class="run-error">{html.escape(str(e))}</div>', None, gr.Dataframe(visible=False),
                        None, "", None)
            key = (run_id, len(metrics), metrics[-1]["step"] if metrics else None, len(logs),
                   logs[-1] if logs else None)
            if seen is not None and key == tuple(seen):
                return progress_html(run), gr.skip(), gr.skip(), gr.skip(), gr.skip(), seen
            same_run = seen is not None and seen[0] == run_id
            refreshes = rm_refresh_frame(metrics)
            return (progress_html(run), metrics_figure(metrics),
                    gr.Dataframe(value=refreshes, visible=not refreshes.empty),
                    gr.skip() if same_run else run["config"], "\n".join(logs), list(key))

        run_outputs = [progress, charts, rm_table, config_view, log_view, chart_seen]
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

        def export(kind):
            def fn(run_id):
                if run_id is None:
                    raise gr.Error("No run selected.")
                return _call(api.export_run, run_id, kind)
            return fn

        for button, kind in ((export_parquet, "parquet"), (export_csv, "csv"), (export_config, "config"),
                             (export_model, "model"), (export_adapter, "adapter")):
            button.click(export(kind), run_select, export_file, **PRIVATE)

        # -- group browser: the slider follows the latest step unless moved back
        def refresh_steps(run_id, value, seen):
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

        steps_io = ([groups_run_select, step_slider, steps_seen], [step_slider, steps_seen])
        groups_run_select.change(refresh_steps, *steps_io, **PRIVATE)
        timer.tick(refresh_steps, *steps_io, **QUIET)

        def show_step(run_id, value, order, seen):
            steps = seen[1] if seen is not None and seen[0] == run_id else []
            step = _nearest_step(steps, value)
            if run_id is None or step is None:
                return groups_frame([]), "<div>No groups recorded yet.</div>"
            try:
                groups = api.list_groups(run_id, step, order)
                first = api.get_group(groups[0]["group_id"]) if groups else None
            except api.ApiError as e:
                return groups_frame([]), f'<div class="run-error">{html.escape(str(e))}</div>'
            return groups_frame(groups), group_html(first) if first else "<div>No groups at this step.</div>"

        step_inputs = [groups_run_select, step_slider, group_order, steps_seen]
        step_slider.change(show_step, step_inputs, [groups_table, group_view], **PRIVATE)
        group_order.change(show_step, step_inputs, [groups_table, group_view], **PRIVATE)

        def show_group(evt: gr.SelectData):
            try:
                return group_html(api.get_group(evt.row_value[0]))
            except api.ApiError as e:
                return f'<div class="run-error">{html.escape(str(e))}</div>'

        groups_table.select(show_group, None, group_view, **PRIVATE)

        # -- compare
        def show_compare(run_ids, metric_keys):
            if not run_ids:
                return None, "<div>Pick runs to compare.</div>"
            try:
                compared = api.compare_runs(run_ids)
            except api.ApiError as e:
                return None, f'<div class="run-error">{html.escape(str(e))}</div>'
            return compare_figure(compared, metric_keys), config_diff_html(compared)

        for component in (compare_select, compare_metrics):
            component.change(show_compare, [compare_select, compare_metrics], [compare_plot, compare_config],
                             **PRIVATE)

        # -- the named API endpoints
        for fn in ENDPOINTS:
            gr.api(fn, api_name=fn.__name__)
    return demo


def _field_input(field):
    """The form input of one run-spec field: radio for choices, a checkbox for booleans, text for strings, else a
    number."""
    if field.choices:
        return gr.Radio(list(field.choices), value=field.default, label=field.name, info=field.help,
                        elem_id=f"spec-{field.name}")
    if field.type is bool:
        return gr.Checkbox(value=field.default, label=field.name, info=field.help, elem_id=f"spec-{field.name}")
    if field.type is str:
        return gr.Textbox(value=field.default, label=field.name, info=field.help, elem_id=f"spec-{field.name}")
    # no min/max/precision on the component: validate_spec is the one judge and names the key
    return gr.Number(value=field.default, label=field.name, info=field.help, elem_id=f"spec-{field.name}")


async def _login(user: str, password: str) -> bool:
    """Gradio's login check, off the event loop: a PBKDF2 hash takes a good fraction of a second, and the
    server keeps answering other requests meanwhile."""
    return await asyncio.to_thread(auth.check, user, password)


def serve(host: str = "127.0.0.1", port: int = 7860) -> None:
    """Bring the store's schema up to date and serve the dashboard (blocks until stopped).

    With users configured (GRPO_AUTH_USERS / GRPO_AUTH_FILE) the page and every API route need a login;
    a malformed entry stops the start (app.auth.AuthConfigError, naming where it is). Uploads larger than
    GRPO_MAX_UPLOAD_MB are refused by Gradio before they are written.
    """
    settings = get_settings()
    users = auth.load_users(settings)
    upgrade_database()
    if users:
        print(f"grpo-dashboard: login required; {len(users)} user{'s' if len(users) != 1 else ''} may log in",
              flush=True)
    else:
        print("grpo-dashboard: no login required (set GRPO_AUTH_USERS or GRPO_AUTH_FILE to require one)", flush=True)
    build_ui().queue().launch(server_name=host, server_port=port, show_error=True, css=CSS,
                              auth=_login if users else None, max_file_size=settings.max_upload_bytes)
