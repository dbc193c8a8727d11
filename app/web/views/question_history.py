"""One question through time, as the Groups tab shows app.service.diagnose_api.question_history: the question, this
run's share of right answers per step (a small SVG line) and its latest groups' outputs side by side, then the other
runs on the same dataset that sampled it. HTML built as strings, the colours of app/web/static/diagnose.css; no
store, no Gradio."""

import html

from app.web.views.diagnose import one_line

HISTORY_GROUPS = 20  # the latest groups of this run shown with their outputs
OUTPUT_CHARS = 160  # an output's completion, cut to this


def _share(value: float | None) -> str:
    """A share of right answers in percent; "–" for none."""
    return "–" if value is None else f"{100 * value:.0f}%"


def share_line_svg(groups: list[dict]) -> str:
    """The share of right answers per group of one question, by step: a line through one marker per group; empty
    for fewer than two groups (the summary line says it all)."""
    points = [(g["step"], g["correct_share"]) for g in groups if g.get("correct_share") is not None]
    if len(points) < 2:
        return ""
    w, h, left, right, top, bottom = 640, 130, 44, 12, 8, 30
    first, last = points[0][0], points[-1][0]
    span = max(last - first, 1)
    xy = [
        (
            left + (w - left - right) * ((s - first) / span if last > first else 0.5),
            top + (h - top - bottom) * (1 - share),
        )
        for s, share in points
    ]
    grid = "".join(
        f'<line class="grid" x1="{left}" x2="{w - right}" y1="{y:.1f}" y2="{y:.1f}"/>'
        f'<text class="tick" x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{label}</text>'
        for y, label in ((top, "100%"), (top + (h - top - bottom) / 2, "50%"), (h - bottom, "0%"))
    )
    marks = "".join(
        f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" class="share-dot" data-step="{s}">'
        f"<title>step {s}: {_share(share)} right</title></circle>"
        for (x, y), (s, share) in zip(xy, points, strict=True)
    )
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
    ticks = (
        f'<text class="tick" x="{left}" y="{h - bottom + 16}">step {first}</text>'
        f'<text class="tick" x="{w - right}" y="{h - bottom + 16}" text-anchor="end">step {last}</text>'
    )
    return (
        f'<svg class="share-svg" viewBox="0 0 {w} {h}" role="img" aria-label="share right by step">{grid}'
        f'<polyline class="share-line" fill="none" points="{line}"/>{marks}{ticks}</svg>'
    )


def _output_box(sample: dict) -> str:
    """One output of a group: its verdict, reward and length over its completion, cut."""
    ok = bool(sample.get("correct"))
    cut = " · cut" if sample.get("truncated") else ""
    return (
        f'<div class="hist-out {"ok" if ok else "bad"}" data-sample-id="{sample["sample_id"]}">'
        f'<div class="hist-out-head"><b>{"✓" if ok else "✗"}</b> {sample["reward"]:+.2f} · '
        f"{sample.get('length') or 0} tok{cut}</div>"
        f'<div class="hist-text">{html.escape(one_line(sample["completion"], OUTPUT_CHARS))}</div></div>'
    )


def _history_groups(groups: list[dict]) -> str:
    """This run's latest HISTORY_GROUPS groups of the question, one row each: the step and its outputs side by side."""
    shown = groups[-HISTORY_GROUPS:]
    note = (
        f'<div class="diag-note">The latest {len(shown)} of {len(groups)} times it was sampled.</div>'
        if len(shown) < len(groups)
        else ""
    )
    rows = "".join(
        f'<div class="hist-group" data-group-id="{g["group_id"]}" data-step="{g["step"]}">'
        f'<div class="hist-step">step {g["step"]}<br><span>{_share(g.get("correct_share"))} right · mean '
        f"{g['reward_mean']:.2f} · {html.escape(str(g.get('kind') or '').replace('_', ' '))}</span></div>"
        f'<div class="hist-outputs">{"".join(_output_box(s) for s in g["samples"])}</div></div>'
        for g in reversed(shown)
    )
    return f'{note}<div class="hist-groups">{rows}</div>'


def _run_title(run: dict) -> str:
    """A run as "#id name" with its status badge (and "archived")."""
    archived = ' <span class="badge">archived</span>' if run.get("archived") else ""
    return (
        f'<span class="badge {html.escape(run["status"])}">{html.escape(run["status"])}</span> '
        f"<b>#{run['run_id']}</b> {html.escape(run['name'])}{archived}"
    )


def _other_runs(runs: list[dict]) -> str:
    """The other runs on the dataset that sampled the question: how often, and how right first and last."""
    if not runs:
        return '<div class="diag-note">No other run on this dataset sampled this question.</div>'
    rows = "".join(
        f'<tr data-run-id="{r["run_id"]}"><td>{_run_title(r)}</td>'
        f'<td class="num">{r.get("groups_total", len(r["groups"]))}</td>'
        f'<td class="num">{_share(r["correct_share_first"])}</td>'
        f'<td class="num">{_share(r["correct_share_last"])}</td></tr>'
        for r in runs
    )
    return (
        '<table class="hist-runs"><tr><th>other run on this dataset</th><th>times sampled</th>'
        f"<th>right, first time</th><th>right, last time</th></tr>{rows}</table>"
    )


def question_history_html(history: dict) -> str:
    """app.service.diagnose_api.question_history as the Groups tab shows it: the question, this run's share of right
    answers per step and its outputs step by step (latest first), then the other runs on the same dataset."""
    this, others = history["runs"][0], history["runs"][1:]
    total = this.get("groups_total", len(this["groups"]))
    summary = (
        f"sampled {total} time{'s' if total != 1 else ''} · right {_share(this['correct_share_first'])} "
        f"the first time, {_share(this['correct_share_last'])} the last"
    )
    return (
        f'<div class="question-history" data-question-key="{html.escape(history.get("question_key") or "")}">'
        f'<div class="diag-title">This question through time</div>'
        f'<div class="diag-note">dataset {html.escape(str(history.get("dataset") or ""))}</div>'
        f'<pre class="hist-question">{html.escape(history["question"])}</pre>'
        f'<div class="hist-run">{_run_title(this)} · {summary}</div>'
        f"{share_line_svg(this['groups'])}{_history_groups(this['groups'])}{_other_runs(others)}</div>"
    )
