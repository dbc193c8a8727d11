"""The diagnosis views: where a run's gradient comes from, and found samples.

:func:`gradient_chart_html` is the Run tab's chart: per step, a stacked bar of how many groups were mixed (some
outputs right, some wrong: where a binary reward's gradient comes from), all right or all wrong (equal rewards:
no gradient), with a line for the zero-spread groups where that count tells something else (continuous
rewards), and the latest step's tokens by the sign of their advantage. Each bar segment carries ``data-step``,
``data-step-end`` and ``data-kind``; CHART_CLICK_JS (the chart's ``js_on_load``) sends a click on one to the
server. :func:`samples_frame` and :func:`pager_text` show a page of app.service.diagnose_api.search_samples;
app.web.views.question_history shows one question through time. Inline SVG and HTML built as strings, the colours
of app/web/static/diagnose.css; no store, no Gradio.
"""

import html
import math

import pandas as pd

from grpo_engine.rewards.rewards import FORM_WORDS

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
    for (x, y), b in zip(points, bins, strict=True):
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

SAMPLE_COLUMNS = [
    "step",
    "group",
    "sample",
    "reward",
    "verdict",
    "answer read",
    "reward components",
    "length",
    "spread",
    "question",
    "completion",
]
COMPLETION_CHARS = 120  # a result's completion, on one line, cut to this
QUESTION_CHARS = 80  # a result's question (the dataset's prompt, before any template), on one line, cut to this
ANSWER_CHARS = 40  # a result's answer read, on one line, cut to this


def one_line(text: str, limit: int) -> str:
    """``text`` on one line, cut to ``limit`` characters ("…" marking the cut).

    >>> one_line("a\\n  b", 10), one_line("abcdef", 3)
    ('a b', 'abc…')
    """
    line = " ".join(text.split())
    return line if len(line) <= limit else line[:limit] + "…"


def verdict_text(row: dict) -> str:
    """A sample's verdict in a word: ✓, ✗, "no answer" (the verifier read none under the run's answer_match:
    ``answer_found``), with "cut" for one stopped at the length limit.

    >>> verdict_text({"correct": True}), verdict_text({"correct": False, "answer_found": False, "truncated": True})
    ('✓', 'no answer · cut')
    """
    word = "✓" if row.get("correct") else "no answer" if row.get("answer_found") is False else "✗"
    return f"{word} · cut" if row.get("truncated") else word


def reading_text(row: dict) -> str:
    """The verifier's reading of a found sample in a few words: the answer it read and, in brackets, the rule that
    read it (rewards.FORM_WORDS); "none read" where it read none; "not recorded" for a sample recorded without it.

    >>> reading_text({"answer": "3", "answer_rule": "number"}), reading_text({"answer": None, "answer_rule": "none"})
    ('3 (flexible last number)', 'none read')
    >>> reading_text({"answer": "14", "answer_rule": "gsm8k"}), reading_text({"answer_rule": None})
    ('14 (strict ####)', 'not recorded')
    """
    rule = row.get("answer_rule")
    if rule is None:
        return "not recorded"
    if row.get("answer") is None:
        return "none read"
    return f"{one_line(row['answer'], ANSWER_CHARS)} ({FORM_WORDS.get(rule, rule)})"


def components_text(components: dict | None) -> str:
    """A found sample's reward components, each with its value (a no-break space between them, so that a wrapped
    cell breaks only between components).

    >>> components_text({"correct": 1.0, "formatted": 0.0, "format": 0.0, "reward/length": 0.4213}).replace("\xa0", " ")
    'correct 1 · formatted 0 · format 0 · reward/length 0.421'
    """
    return " · ".join(f"{key}\xa0{value:.3g}" for key, value in (components or {}).items())


def samples_frame(result: dict | None) -> pd.DataFrame:
    """One page of app.service.diagnose_api.search_samples as a table (SAMPLE_COLUMNS); empty without a result."""
    rows = [
        [
            r["step"],
            r["group_id"],
            r["sample_id"],
            round(r["reward"], 4),
            verdict_text(r),
            reading_text(r),
            components_text(r.get("reward_components")),
            r["length"],
            None if r["spread"] is None else round(r["spread"], 4),
            one_line(r["question"], QUESTION_CHARS),
            one_line(r["completion"], COMPLETION_CHARS),
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
