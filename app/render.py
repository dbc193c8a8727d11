"""The dashboard's renderers: plain functions from app.api's dicts to what the browser shows.

Tables as pandas frames (runs, groups, reward-model refreshes), HTML strings (run progress, a group's
completions coloured token by token, config differences, a dataset preview) and plotly figures (a run's
metrics in panels, several runs' curves). Nothing here calls the store or imports Gradio; the chart panels
come from the engine's metric registry (grpo_engine.recorder.METRIC_REGISTRY).
"""
import html
from datetime import datetime, timezone

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from grpo_engine.recorder import METRIC_REGISTRY

RUN_COLUMNS = ["id", "name", "status", "model", "dataset", "step", "created (UTC)"]
GROUP_COLUMNS = ["group", "prompt", "reward mean", "reward std"]
# The Run tab's chart panels: (title, metric names), in registry order. A recorded metric in no panel goes
# to "other".
PANELS = tuple((title, tuple(m.name for m in METRIC_REGISTRY if m.panel == title))
               for title in dict.fromkeys(m.panel for m in METRIC_REGISTRY if m.panel is not None))
# The reward-model table: each column's header and the recorded metric it shows ("change" is after - before)
RM_TABLE = (("iteration", "iteration"), ("step", "step"), ("rm/loss", "rm/loss"),
            ("accuracy before", "rm/accuracy_before"), ("accuracy after", "rm/accuracy_after"), ("change", None),
            ("examples", "rm/train_examples"), ("replayed", "rm/replayed"))
RM_COLUMNS = [header for header, _ in RM_TABLE]
_RM_ROUNDED = {"rm/loss", "rm/accuracy_before", "rm/accuracy_after"}  # shown to 4 decimals


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
        change = None if before is None else _round(after - before)
        rows.append([change if key is None else _round(m.get(key)) if key in _RM_ROUNDED else m.get(key)
                     for _, key in RM_TABLE])
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
    supervision), the normalised one: the engine's advantage, the same on every token (each completion has
    at least its end token); process supervision marks each step's end with its reward.
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
            # outcome supervision: every token carries the reward the engine normalised within the group
            norm = f'{sample["advantages"][0]:+.3f}' if sample["advantages"] else "n/a"
            reward_text = f'reward <b>{sample["reward"]:+.3f}</b> · normalised <b class="norm">{norm}</b>'
        out.append(
            f'<div class="sample" data-sample-id="{sample["sample_id"]}" data-reward="{sample["reward"]:.6g}">'
            f'<div class="sample-head"><b>sample {i + 1}</b> · {reward_text} · {len(sample["tokens"])} tokens'
            f'<div class="verdicts">{_verdicts(sample.get("reward_components") or {})}</div></div>'
            f'<div class="tokens">{"".join(spans)}</div></div>'
        )
    out.append("</div></div>")
    return "".join(out)
