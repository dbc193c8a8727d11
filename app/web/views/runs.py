"""The Runs tab's renderers: plain functions from app.service.manage_api.runs_overview's dicts to what the browser shows.

The table is HTML (app/web/static/runs.css styles it): one row per run with its status as a coloured badge (the Run tab's
colours, app/web/static/dashboard.css) and, while it runs, its phase; its newest headline metrics, how long it ran, when
it was made, its tags. Each row carries ``data-run-id``: app.web.tabs.runs' script opens the run on a click, or
picks it for the Manage area on a click on its "Manage" button. Nothing here calls the store or imports Gradio.
"""

from __future__ import annotations

import html
from datetime import datetime, timezone

from app.core.run_status import ACTIVE_STATUSES, RunStatus
from app.service.datasets import uploaded_name
from app.web.views.run import clock_html, duration_text, parse_time

STATUS_FILTERS = (
    ("All runs", "all"),
    ("Active (queued or running)", "active"),
    *((status.value.capitalize(), status.value) for status in RunStatus),
)
COLUMNS = (
    "#",
    "name",
    "status",
    "model",
    "dataset",
    "step",
    "reward",
    "correct",
    "eval acc",
    "duration",
    "created (UTC)",
    "",
)
NUMERIC = {"#", "step", "reward", "correct", "eval acc", "duration"}  # right-aligned columns


def run_duration(run: dict, now: datetime | None = None) -> str:
    """How long a run has run, as HTML: started to finished, or to ``now`` while it runs (a clock the page counts
    on); '' before it started."""
    started = parse_time(run.get("started_at"))
    if started is None:
        return ""
    end = parse_time(run.get("finished_at"))
    if end is None and run["status"] == RunStatus.RUNNING:
        return clock_html(((now or datetime.now(timezone.utc)) - started).total_seconds())
    return duration_text((end - started).total_seconds()) if end else ""


def phase_text(run: dict) -> str:
    """What a running run is doing, e.g. 'building built-in model 400/900'; '' when it is not running or has
    reported no phase."""
    if run["status"] != RunStatus.RUNNING or not run.get("phase"):
        return ""
    done, total = run.get("phase_done"), run.get("phase_total")
    count = f" {done}/{total}" if done is not None and total else f" {done}" if done is not None else ""
    return f"{run['phase']}{count}"


def matches(run: dict, status: str, search: str, show_archived: bool) -> bool:
    """Whether the table shows ``run``: its status passes the filter (STATUS_FILTERS' values), every word of
    ``search`` is in its name, model, dataset, tags or '#id' (any case), and it is not archived unless asked."""
    if run.get("archived") and not show_archived:
        return False
    if status == "active" and run["status"] not in ACTIVE_STATUSES:
        return False
    if status not in ("all", "active", None, "") and run["status"] != status:
        return False
    haystack = " ".join([f"#{run['run_id']}", run["name"], run["model"], run["dataset"], *run.get("tags", [])]).lower()
    return all(word in haystack for word in (search or "").lower().split())


def short_path(value: str) -> str:
    """The last part of a model or dataset path or id (the table's cell; the full value is its tooltip)."""
    return value.rstrip("/").rsplit("/", 1)[-1] or value


def _number(value, percent: bool = False) -> str:
    """A headline metric: 0.625 or, as a share, 62.5%; a dash when not recorded (or NaN, stored as null)."""
    if value is None:
        return '<span class="none">–</span>'
    return f"{100 * value:.1f}%" if percent else f"{value:.3f}"


def _status_cell(run: dict) -> str:
    """The status badge, with the phase of a running run under it."""
    status = html.escape(run["status"])
    phase = phase_text(run)
    detail = f'<div class="run-phase">{html.escape(phase)}</div>' if phase else ""
    return f'<span class="badge {status}">{status}</span>{detail}'


def _name_cell(run: dict) -> str:
    """The run's name, with its tags as chips, an 'archived' chip, and its notes as the tooltip of a mark."""
    chips = "".join(f'<span class="tag">{html.escape(tag)}</span>' for tag in run.get("tags", []))
    if run.get("archived"):
        chips += '<span class="tag archived">archived</span>'
    notes = run.get("notes") or ""
    mark = f'<span class="notes-mark" title="{html.escape(notes)}" aria-label="notes">✎</span>' if notes else ""
    tags = f'<div class="tags">{chips}</div>' if chips else ""
    return f'<span class="run-name">{html.escape(run["name"])}</span>{mark}{tags}'


def _row(run: dict, now: datetime, selected: int | None) -> str:
    """One table row: ``data-run-id`` for the click handlers, the cells in COLUMNS order."""
    headline = run.get("headline") or {}
    created = parse_time(run.get("created_at"))
    created_text = created.strftime("%Y-%m-%d %H:%M") if created else ""
    cells = [
        f"{run['run_id']}",
        _name_cell(run),
        _status_cell(run),
        f'<span title="{html.escape(run["model"])}">{html.escape(short_path(run["model"]))}</span>',
        f'<span title="{html.escape(run["dataset"])}">{html.escape(uploaded_name(run["dataset"]))}</span>',
        f"{run['step']}/{run['total_steps']}"
        if run["total_steps"]
        else '<span title="steps_per_iteration 0">eval only</span>',
        _number(headline.get("reward_mean")),
        _number(headline.get("correct_frac"), percent=True),
        _number(headline.get("eval/accuracy"), percent=True),
        run_duration(run, now),
        f'<span title="{html.escape(run.get("created_at") or "")}">{created_text}</span>',
        f'<button class="run-manage" data-manage="1" title="Rename, tag, archive or delete run #{run["run_id"]}">'
        "Manage</button>",
    ]
    tds = "".join(
        f'<td class="{"num" if c in NUMERIC else ""} col-{_slug(c)}">{cell}</td>'
        for c, cell in zip(COLUMNS, cells, strict=True)
    )
    classes = " ".join(
        ["run-row", run["status"]]
        + (["archived"] if run.get("archived") else [])
        + (["selected"] if run["run_id"] == selected else [])
    )
    return (
        f'<tr class="{classes}" data-run-id="{run["run_id"]}" tabindex="0" '
        f'title="Open run #{run["run_id"]} in the Run tab">{tds}</tr>'
    )


def _slug(column: str) -> str:
    """A column's CSS class suffix: 'created (UTC)' -> 'created', '#' -> 'id', '' -> 'manage'."""
    return {"#": "id", "": "manage"}.get(column, column.split(" (")[0].replace(" ", "-"))


def runs_table_html(
    runs: list[dict],
    shown: list[dict],
    selected: int | None = None,
    show_archived: bool = False,
    now: datetime | None = None,
) -> str:
    """The Runs table of ``shown`` (the runs that pass the filter), with a line counting them against all
    ``runs`` and, unless ``show_archived``, the archived ones hidden; ``selected``: the run the Manage area acts
    on, highlighted."""
    now = now or datetime.now(timezone.utc)
    hidden_archived = 0 if show_archived else sum(1 for r in runs if r.get("archived"))
    if not runs:
        return (
            '<div class="runs-empty">No runs yet. Launch one from the <b>Launch</b> tab, or through the API '
            "(<code>/launch_run</code>).</div>"
        )
    count = f"{len(shown)} of {len(runs)} runs shown" if len(shown) != len(runs) else runs_count(len(runs))
    if hidden_archived:
        count += f" · {hidden_archived} archived hidden"
    head = "".join(f'<th class="{"num" if c in NUMERIC else ""} col-{_slug(c)}">{html.escape(c)}</th>' for c in COLUMNS)
    if shown:
        body = "".join(_row(run, now, selected) for run in shown)
    else:
        body = f'<tr><td colspan="{len(COLUMNS)}" class="runs-none">No run matches the filter.</td></tr>'
    return (
        f'<div class="runs-count">{count} · click a row to open it</div>'
        f'<div class="runs-scroll"><table class="runs-table"><thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table></div>"
    )


def runs_count(n: int) -> str:
    """'1 run', '3 runs'."""
    return f"{n} run" if n == 1 else f"{n} runs"


def run_choices(runs: list[dict]) -> list[tuple[str, int]]:
    """Run picker entries, newest first: ('#12 name (status)', 12)."""
    return [(f"#{r['run_id']} {r['name']} ({r['status']})", r["run_id"]) for r in runs]
