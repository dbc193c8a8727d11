"""The diagnosis views: where a run's gradient comes from, found samples, and one question through time.

:func:`gradient_chart_html` is the Run tab's chart: per step, a stacked bar of how many groups were mixed (some
outputs right, some wrong: where a binary reward's gradient comes from), all right or all wrong (equal rewards:
no gradient), with a line for the zero-spread groups where that count tells something else (continuous
rewards), and the latest step's tokens by the sign of their advantage. Each bar segment carries ``data-step``,
``data-step-end`` and ``data-kind``; CHART_CLICK_JS (the chart's ``js_on_load``) sends a click on one to the
server. :func:`samples_frame` and :func:`pager_text` show a page of app.service.diagnose_api.search_samples;
:func:`question_history_html` shows app.service.diagnose_api.question_history. Inline SVG and HTML built as strings, the
colours of app/web/static/diagnose.css; no store, no Gradio.
"""

import html
import math

import pandas as pd

# the bar segments, bottom to top: (kind, legend words); each kind's colour is app/web/static/diagnose.css's
KINDS = (
    ("mixed", "mixed: some outputs right, some wrong (the gradient)"),
    ("all_right", "all right (no gradient)"),
    ("all_wrong", "all wrong (no gradient)"),
)
MAX_BARS = 200  # more recorded steps than this: each bar stands for a range of steps
W, H = 960, 250  # the SVG's viewBox
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 10, 40  # the margins around the plot
# The chart's clicks, sent as a click event with {step, step_end, kind} (only clicks on a bar segment or a
# zero-spread marker: everything else in the chart sends nothing).
CHART_CLICK_JS = """
element.addEventListener('click', (event) => {
  const mark = event.target.closest('[data-kind]');
  if (!mark) return;
  trigger('click', {step: Number(mark.dataset.step), step_end: Number(mark.dataset.stepEnd),
                    kind: mark.dataset.kind});
});
"""
TITLE = '<div class="diag-title">Where the gradient comes from</div>'


def bin_rows(rows: list[dict], max_bars: int = MAX_BARS) -> list[dict]:
    """The metric rows that counted groups, in at most ``max_bars`` bins of consecutive rows: each bin's first
    and last step (``step``, ``step_end``), its row count and the mean per step of each count.

    >>> rows = [{"step": s, "groups/mixed": s} for s in (1, 2, 3)]
    >>> [(b["step"], b["step_end"], b["mixed"]) for b in bin_rows(rows, 2)]
    [(1, 2, 1.5), (3, 3, 3.0)]
    """
    counted = [r for r in rows if r.get("groups/mixed") is not None]
    width = max(1, math.ceil(len(counted) / max_bars))
    bins = []
    for i in range(0, len(counted), width):
        chunk = counted[i : i + width]
        b = {"step": chunk[0]["step"], "step_end": chunk[-1]["step"], "steps": len(chunk)}
        for kind in ("mixed", "all_right", "all_wrong", "zero_spread"):
            values = [r[f"groups/{kind}"] for r in chunk if r.get(f"groups/{kind}") is not None]
            b[kind] = sum(values) / len(values) if values else 0.0
        bins.append(b)
    return bins


def zero_spread_differs(rows: list[dict]) -> bool:
    """Whether some step's zero-spread groups are not just its all-right and all-wrong ones (continuous rewards)."""
    return any(
        abs(r["groups/zero_spread"] - (r.get("groups/all_right") or 0) - (r.get("groups/all_wrong") or 0)) > 1e-9
        for r in rows
        if r.get("groups/zero_spread") is not None and r.get("groups/mixed") is not None
    )


def _nice_top(value: float) -> tuple[int, int]:
    """A count axis's top at or above ``value`` and its tick spacing (1, 2 or 5 times a power of ten; at most 5
    ticks).

    >>> _nice_top(7), _nice_top(2), _nice_top(0.4), _nice_top(64)
    ((8, 2), (2, 1), (1, 1), (80, 20))
    """
    for power in range(12):
        for base in (1, 2, 5):
            tick = base * 10**power
            if value <= 4 * tick:
                return max(tick, math.ceil(value / tick) * tick), tick
    raise ValueError(f"no axis for {value}")


def _number(value: float) -> str:
    """A count or a mean count: whole numbers without decimals."""
    return f"{value:.0f}" if abs(value - round(value)) < 1e-9 else f"{value:.2f}"


def _steps_text(b: dict) -> str:
    """A bar's steps: "step 7", or "steps 11–20 (mean)"."""
    return f"step {b['step']}" if b["steps"] == 1 else f"steps {b['step']}–{b['step_end']} (mean)"


def _axes(bins: list[dict], top: float, tick: float, binned: bool) -> list[str]:
    """The y axis with its grid and ticks, the x axis's step labels (at most 8) and both axis titles."""
    plot_w, plot_h = W - LEFT - RIGHT, H - TOP - BOTTOM
    out = []
    for k in range(int(round(top / tick)) + 1):
        y = TOP + plot_h * (1 - k * tick / top)
        out.append(
            f'<line class="grid" x1="{LEFT}" x2="{W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text class="tick" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_number(k * tick)}</text>'
        )
    slot = plot_w / len(bins)
    every = max(1, math.ceil(len(bins) / 8))
    for i in range(0, len(bins), every):
        x = LEFT + slot * (i + 0.5)
        out.append(
            f'<text class="tick" x="{x:.1f}" y="{TOP + plot_h + 16}" text-anchor="middle">{bins[i]["step"]}</text>'
        )
    out.append(
        f'<text class="axis-title" x="{LEFT + plot_w / 2:.1f}" y="{H - 4}" text-anchor="middle">'
        f"step{' (each bar: a range of steps, from the step labelled)' if binned else ''}</text>"
    )
    out.append(
        f'<text class="axis-title" transform="rotate(-90)" x="{-(TOP + plot_h / 2):.1f}" y="14" '
        f'text-anchor="middle">groups{" per step (mean)" if binned else ""}</text>'
    )
    return out


def _bars(bins: list[dict], top: float) -> list[str]:
    """The stacked bar segments, one ``rect`` per non-empty count, each with its tooltip and data attributes."""
    plot_w, plot_h = W - LEFT - RIGHT, H - TOP - BOTTOM
    slot = plot_w / len(bins)
    width = max(min(slot * 0.8, 40.0), 1.0)
    out = []
    for i, b in enumerate(bins):
        x, base = LEFT + slot * (i + 0.5) - width / 2, 0.0
        total = b["mixed"] + b["all_right"] + b["all_wrong"]
        for kind, words in KINDS:
            if b[kind] <= 0:
                continue
            y0, y1 = TOP + plot_h * (1 - base / top), TOP + plot_h * (1 - (base + b[kind]) / top)
            base += b[kind]
            tip = f"{_steps_text(b)}: {_number(b[kind])} of {_number(total)} groups {words.split(' (')[0]}"
            out.append(
                f'<rect data-step="{b["step"]}" data-step-end="{b["step_end"]}" data-kind="{kind}" '
                f'x="{x:.1f}" y="{y1:.1f}" width="{width:.1f}" height="{max(y0 - y1, 0.5):.1f}"'
                f"><title>{html.escape(tip)}</title></rect>"
            )
    return out


def _zero_spread_line(bins: list[dict], top: float) -> list[str]:
    """The zero-spread groups per bar: a dashed line through a clickable marker on each bar."""
    plot_w, plot_h = W - LEFT - RIGHT, H - TOP - BOTTOM
    slot = plot_w / len(bins)
    points = [(LEFT + slot * (i + 0.5), TOP + plot_h * (1 - b["zero_spread"] / top)) for i, b in enumerate(bins)]
    out = [f'<polyline class="zero-line" points="{" ".join(f"{x:.1f},{y:.1f}" for x, y in points)}"/>']
    radius = 3.5 if len(bins) <= 60 else 2.0
    for (x, y), b in zip(points, bins):
        tip = f"{_steps_text(b)}: {_number(b['zero_spread'])} groups with zero reward spread"
        out.append(
            f'<circle data-step="{b["step"]}" data-step-end="{b["step_end"]}" '
            f'data-kind="zero_spread" cx="{x:.1f}" cy="{y:.1f}" r="{radius}">'
            f"<title>{html.escape(tip)}</title></circle>"
        )
    return out


def _legend(zero_line: bool, binned_by: int) -> str:
    """The chart's legend, and how to use it. Where the zero-spread line shows (continuous rewards), a group's
    verdicts no longer say whether it carries a gradient, and the kinds' words leave that out."""
    items = [
        f'<span class="diag-key"><i class="k-{kind}"></i>'
        f"{html.escape(words.split(' (')[0] if zero_line else words)}</span>"
        for kind, words in KINDS
    ]
    if zero_line:
        items.append(
            '<span class="diag-key"><i class="k-zero_spread"></i>'
            "zero reward spread (all rewards equal: no gradient)</span>"
        )
    note = f" Each bar stands for {binned_by} steps." if binned_by > 1 else ""
    return (
        f'<div class="diag-legend">{"".join(items)}</div>'
        f'<div class="diag-note">Hover a bar for its counts; click it to open those groups in the Groups tab.'
        f"{note}</div>"
    )


def token_shares_html(rows: list[dict]) -> str:
    """The latest step's tokens by the sign of their advantage, as one thin stacked bar with its shares in words;
    empty where no step recorded them."""
    row = next((r for r in reversed(rows) if r.get("tokens/adv_pos") is not None), None)
    if row is None:
        return ""
    parts = (
        ("pos", "pushed up (A > 0)", row.get("tokens/adv_pos") or 0.0),
        ("neg", "pushed down (A < 0)", row.get("tokens/adv_neg") or 0.0),
        ("zero", "zero advantage (no gradient)", row.get("tokens/adv_zero") or 0.0),
    )
    bar = "".join(
        f'<span class="tok-{key}" style="width:{100 * share:.2f}%" data-share="{share:.4f}" '
        f'title="{html.escape(f"{100 * share:.1f}% of tokens {words}")}"></span>'
        for key, words, share in parts
    )
    words = "".join(
        f'<span class="tok-key tok-{key}-key"><i></i>{100 * share:.0f}% {html.escape(words)}</span>'
        for key, words, share in parts
    )
    return (
        f'<div class="token-shares" data-step="{row["step"]}"><div class="diag-sub">Tokens at step '
        f'{row["step"]} (the latest)</div><div class="tok-bar">{bar}</div><div class="tok-words">{words}</div>'
        "</div>"
    )


def gradient_chart_html(rows: list[dict], max_bars: int = MAX_BARS) -> str:
    """The Run tab's chart of a run's metric rows (app.service.api.get_metrics): its title, the stacked bars (with the
    zero-spread line where it differs), the legend and the latest step's token shares; a note where no step
    counted its groups."""
    bins = bin_rows(rows, max_bars)
    if not bins:
        return (
            f'<div class="gradient-chart empty">{TITLE}<div class="diag-note">No group counts recorded yet: '
            "the chart appears once the run records a step (runs recorded before the counts existed have "
            "none).</div></div>"
        )
    zero_line = zero_spread_differs(rows)
    highest = max(
        max(b["mixed"] + b["all_right"] + b["all_wrong"] for b in bins),
        max(b["zero_spread"] for b in bins) if zero_line else 0.0,
    )
    top, tick = _nice_top(highest)
    binned_by = max(b["steps"] for b in bins)
    body = _axes(bins, top, tick, binned_by > 1) + _bars(bins, top)
    if zero_line:
        body += _zero_spread_line(bins, top)
    svg = (
        f'<svg class="diag-svg" viewBox="0 0 {W} {H}" preserveAspectRatio="xMinYMin meet" role="img" '
        'aria-label="groups per step by kind">'
        f"{''.join(body)}</svg>"
    )
    return (
        f'<div class="gradient-chart" data-bars="{len(bins)}" data-zero-line="{int(zero_line)}">{TITLE}'
        f"{_legend(zero_line, binned_by)}{svg}{token_shares_html(rows)}</div>"
    )


# ---- found samples ----------------------------------------------------------------------------

SAMPLE_COLUMNS = ["step", "group", "sample", "reward", "verdict", "length", "spread", "question", "completion"]
COMPLETION_CHARS = 120  # a result's completion, on one line, cut to this
QUESTION_CHARS = 80  # a result's question (the dataset's prompt, before any template), on one line, cut to this


def _one_line(text: str, limit: int) -> str:
    """``text`` on one line, cut to ``limit`` characters ("…" marking the cut).

    >>> _one_line("a\\n  b", 10), _one_line("abcdef", 3)
    ('a b', 'abc…')
    """
    line = " ".join(text.split())
    return line if len(line) <= limit else line[:limit] + "…"


def verdict_text(row: dict) -> str:
    """A sample's verdict in a word: ✓, ✗, "no answer" (none found), with "cut" for one stopped at the length limit.

    >>> verdict_text({"correct": True}), verdict_text({"correct": False, "answer_found": False, "truncated": True})
    ('✓', 'no answer · cut')
    """
    word = "✓" if row.get("correct") else "no answer" if row.get("answer_found") is False else "✗"
    return f"{word} · cut" if row.get("truncated") else word


def samples_frame(result: dict | None) -> pd.DataFrame:
    """One page of app.service.diagnose_api.search_samples as a table (SAMPLE_COLUMNS); empty without a result."""
    rows = [
        [
            r["step"],
            r["group_id"],
            r["sample_id"],
            round(r["reward"], 4),
            verdict_text(r),
            r["length"],
            None if r["spread"] is None else round(r["spread"], 4),
            _one_line(r["question"], QUESTION_CHARS),
            _one_line(r["completion"], COMPLETION_CHARS),
        ]
        for r in (result or {}).get("rows", [])
    ]
    return pd.DataFrame(rows, columns=SAMPLE_COLUMNS)


def pager_text(result: dict | None, error: str | None = None) -> str:
    """The line under the results: "page k of n (t samples)", or why the search was refused."""
    if error is not None:
        return f'<div class="run-error find-error">{html.escape(error)}</div>'
    if result is None:
        return '<div class="find-pager">Set the filters, then Find.</div>'
    total = result["total"]
    return (
        f'<div class="find-pager" data-total="{total}" data-page="{result["page"]}" data-pages="{result["pages"]}">'
        f"page {result['page']} of {result['pages']} ({total} sample{'s' if total != 1 else ''} found)</div>"
    )


def mark_sample(group_view: str, sample_id: int | None) -> str:
    """A group view (app.web.views.group.group_html) with one sample's card marked as the one found."""
    if sample_id is None:
        return group_view
    attribute = f'data-sample-id="{int(sample_id)}"'
    return group_view.replace(attribute, f'{attribute} data-found="1"', 1)


# ---- one question through time ----------------------------------------------------------------

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
        for (x, y), (s, share) in zip(xy, points)
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
        f'<div class="hist-text">{html.escape(_one_line(sample["completion"], OUTPUT_CHARS))}</div></div>'
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
