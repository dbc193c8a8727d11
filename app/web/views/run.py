"""The dashboard's renderers: plain functions from app.service.api's dicts to what the browser shows.

Tables as pandas frames (runs, groups, reward-model refreshes) and HTML strings (run progress with its phase
and key numbers, config differences, a dataset preview). One group's view is app.web.views.group's, the charts are
app.web.views.charts'. Nothing here calls the store or imports Gradio.
"""

import html
from datetime import datetime, timezone

import pandas as pd

from app.core.run_status import ACTIVE_STATUSES, RunStatus
from app.service.health import MIN_STEPS, MIN_STEPS_RECENT

GROUP_COLUMNS = ["group", "prompt", "reward mean", "reward std"]
# The reward-model table: each column's header and the recorded metric it shows ("change" is after - before)
RM_TABLE = (
    ("iteration", "iteration"),
    ("step", "step"),
    ("rm/loss", "rm/loss"),
    ("accuracy before", "rm/accuracy_before"),
    ("accuracy after", "rm/accuracy_after"),
    ("change", None),
    ("examples", "rm/train_examples"),
    ("replayed", "rm/replayed"),
)
RM_COLUMNS = [header for header, _ in RM_TABLE]
_RM_ROUNDED = {"rm/loss", "rm/accuracy_before", "rm/accuracy_after"}  # shown to 4 decimals


def parse_time(value: str | None) -> datetime | None:
    """An ISO time from the store as an aware datetime (UTC where it names no zone); None for none."""
    if not value:
        return None
    t = datetime.fromisoformat(value)
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def duration_text(seconds: float) -> str:
    """A duration for people: '45s', '3m 05s', '2h 07m' or '3d 04h'.

    >>> duration_text(42), duration_text(200), duration_text(3900), duration_text(273600)
    ('42s', '3m 20s', '1h 05m', '3d 04h')
    """
    seconds = int(round(max(seconds, 0)))
    d, rest = divmod(seconds, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    if d:
        return f"{d}d {h:02d}h"
    return f"{h}h {m:02d}m" if h else f"{m}m {s:02d}s" if m else f"{s}s"


def clock_html(seconds: float, prefix: str = "") -> str:
    """A running duration: ``prefix`` and :func:`duration_text` of ``seconds``, counted on by the page itself
    every second (app.web.ui's DASHBOARD_JS reads ``data-elapsed``), so that a running run's elapsed time moves
    without the server drawing the view again."""
    return (
        f'<span class="clock" data-elapsed="{max(seconds, 0):.0f}" data-prefix="{html.escape(prefix)}">'
        f"{html.escape(prefix)}{duration_text(seconds)}</span>"
    )


KEY_NUMBERS = ("reward_mean", "correct_frac", "eval/accuracy", "kl")  # the run header's line of latest values


def progress_html(run: dict, now: datetime | None = None, metrics: list[dict] | None = None) -> str:
    """Status badge and, while running, what the run is doing (its phase, with a bar of its own when it has a
    count); the progress bar, percentage, elapsed time and ETA, the worker (and attempt, after a resume) and
    the newest checkpoint; the latest key numbers of ``metrics`` (the run's metric rows); the error of a
    failed run."""
    now = now or datetime.now(timezone.utc)
    status, step, total = run["status"], run["step"] or 0, run["total_steps"] or 0
    pct = 100.0 * step / total if total else (100.0 if status == RunStatus.COMPLETED else 0.0)  # 0 steps: evaluation
    error = f'<pre class="run-error">{html.escape(run["error"])}</pre>' if run.get("error") else ""
    phase = run.get("phase") if status == RunStatus.RUNNING else None
    return (
        f'<div class="run-progress" data-status="{status}" data-step="{step}" data-total="{total}"'
        f' data-phase="{html.escape(phase or "")}">'
        f'<div class="run-title"><span class="badge {status}">{status}</span>'
        f"<b>#{run['run_id']}</b> {html.escape(run['name'])}{_phase_html(run) if phase else ''}</div>"
        f'<div class="progress-track"><div class="progress-fill {status}" style="width:{pct:.1f}%"></div></div>'
        f'<div class="progress-text">{" · ".join(_progress_parts(run, now, metrics or []))}</div>'
        f"{_key_numbers_html(metrics or [], (run.get('config') or {}).get('answer_match', 'strict'))}{error}</div>"
    )


def _phase_html(run: dict) -> str:
    """What a running run is doing now, e.g. "building built-in model 400 / 900" with a small bar."""
    done, total = run.get("phase_done"), run.get("phase_total")
    text = html.escape(run["phase"])
    if run["phase"] == "training":  # its count is the step, which the run's own bar shows
        return f'<span class="phase">{text}</span>'
    if not total:
        return f'<span class="phase">{text}{f" {done}" if done is not None else ""}</span>'
    done = min(max(done or 0, 0), total)
    return (
        f'<span class="phase">{text} {done} / {total}<span class="phase-track">'
        f'<span class="phase-fill" style="width:{100.0 * done / total:.1f}%"></span></span></span>'
    )


def _progress_parts(run: dict, now: datetime, metrics: list[dict]) -> list[str]:
    """The progress line's parts: iteration, step, percentage, the worker or the wait for one, the newest
    checkpoint, elapsed time and ETA (while training; ``metrics``' timings, see eta_seconds) or the run's
    duration (once finished)."""
    status, step, total = run["status"], run["step"] or 0, run["total_steps"] or 0
    started, finished = parse_time(run.get("started_at")), parse_time(run.get("finished_at"))
    config = run.get("config") or {}
    if config.get("steps_per_iteration") == 0:
        parts = ["evaluation only (steps_per_iteration 0)"]
    else:
        parts = [f"step {step} / {total}", f"{100.0 * step / total if total else 0.0:.0f}%"]
    iterations, per_iteration = config.get("iterations") or 1, config.get("steps_per_iteration") or total
    if iterations > 1 and per_iteration:
        iteration = min(iterations, max(1, -(-step // per_iteration)))  # the iteration of the current step
        parts.insert(0, f"iteration {iteration} / {iterations}")
    checkpoint = run.get("checkpoint_step")
    if status == RunStatus.QUEUED and run.get("attempts"):  # it ran before: paused, or its worker died
        parts.append(f"waiting for a worker to resume it from {f'step {checkpoint}' if checkpoint else 'the start'}")
    elif status == RunStatus.QUEUED:
        parts.append("waiting for a worker")
    if status == RunStatus.RUNNING and run.get("worker"):
        parts.append(
            f"on {run['worker']}" + (f" (attempt {run['attempts']})" if (run.get("attempts") or 0) > 1 else "")
        )
    if checkpoint and status in ACTIVE_STATUSES:
        parts.append(f"checkpoint at step {checkpoint}")
    if started and status == RunStatus.RUNNING:
        elapsed = (now - started).total_seconds()
        parts.append(clock_html(elapsed, "elapsed "))
        # before the first step is done there is nothing to average, and while the run still prepares (its
        # phase) no ETA is promised
        if step:
            parts.append(f"ETA {duration_text(eta_seconds(metrics, step, total, elapsed))}")
        elif run.get("phase") in (None, "training"):
            parts.append("ETA: estimating")
        if run.get("cancel_requested"):
            parts.append("cancelling at the next step")
    elif started and finished:
        parts.append(f"ran {duration_text((finished - started).total_seconds())}")
    return parts


def eta_seconds(metrics: list[dict], step: int, total: int, elapsed: float) -> float:
    """The seconds a running run still needs: the steps left times the mean seconds of a recorded training step
    (its time/step plus its time/eval, so evaluations count at their share), which leaves out what came before
    the first step (loading, the built-in model's build, the reward model's first training). Without recorded
    timings: the elapsed time per finished step.

    >>> eta_seconds([{"step": 1, "time/step": 2.0}, {"step": 2, "time/step": 2.0, "time/eval": 2.0}], 2, 10, 300.0)
    24.0
    """
    timed = [row for row in metrics if row.get("time/step") is not None]
    if not timed:
        return elapsed / step * (total - step)
    seconds = sum(row["time/step"] + (row.get("time/eval") or 0.0) for row in timed)
    return seconds / len(timed) * (total - step)


def _key_numbers_html(metrics: list[dict], answer_match: str = "strict") -> str:
    """The latest value of each KEY_NUMBERS metric in one line (with its step where it is older than the
    newest row's, e.g. the last evaluation), eval/accuracy with the rule that read it (the run's ``answer_match``);
    empty before any metric.

    >>> _key_numbers_html([{"step": 0, "eval/accuracy": 0.25}], "flexible")
    '<div class="key-numbers">latest, step 0: <span data-key="eval/accuracy">eval/accuracy (flexible) <b>0.25</b></span></div>'
    """
    if not metrics:
        return ""
    newest = metrics[-1]["step"]
    parts = []
    for key in KEY_NUMBERS:
        row = next((m for m in reversed(metrics) if m.get(key) is not None), None)
        if row is not None:
            at = f' <span class="at">(step {row["step"]})</span>' if row["step"] != newest else ""
            name = f"{key} ({answer_match})" if key == "eval/accuracy" else key
            parts.append(f'<span data-key="{key}">{name} <b>{row[key]:.3g}</b>{at}</span>')
    if not parts:
        return ""
    return f'<div class="key-numbers">latest, step {newest}: {" · ".join(parts)}</div>'


def rm_refresh_frame(metrics: list[dict]) -> pd.DataFrame:
    """One row per reward-model (re)training: at step 0 its first training, then each refresh."""
    rows = []
    for m in metrics:
        if m.get("rm/accuracy_after") is None:
            continue
        before, after = m.get("rm/accuracy_before"), m["rm/accuracy_after"]
        change = None if before is None else _round(after - before)
        rows.append(
            [change if key is None else _round(m.get(key)) if key in _RM_ROUNDED else m.get(key) for _, key in RM_TABLE]
        )
    return pd.DataFrame(rows, columns=RM_COLUMNS)


def _round(value, digits: int = 4):
    """``value`` rounded to ``digits`` decimals, None kept."""
    return None if value is None else round(float(value), digits)


def config_diff_html(compared: dict) -> str:
    """The compared runs' configs, one column per run: a table of the keys that differ, and the keys they share
    folded away below it."""
    runs, differing = compared["runs"], set(compared["differing_keys"])
    keys = sorted({k for r in runs for k in r["config"]})
    head = "<tr><th>key</th>" + "".join(f"<th>#{r['run_id']} {html.escape(r['name'])}</th>" for r in runs) + "</tr>"

    def rows(chosen: list[str], cls: str) -> str:
        return "".join(
            f'<tr{cls} data-key="{html.escape(k)}"><th>{html.escape(k)}</th>'
            + "".join(f"<td>{html.escape(str(r['config'].get(k, '')))}</td>" for r in runs)
            + "</tr>"
            for k in chosen
        )

    shown, same = [k for k in keys if k in differing], [k for k in keys if k not in differing]
    note = (
        f"{len(shown)} key{'s differ' if len(shown) != 1 else ' differs'}: {', '.join(shown)}"
        if shown
        else "The configs are the same."
    )
    table = "<table>" + head + rows(shown, ' class="diff"') + "</table>" if shown else ""
    folded = (
        f'<details class="config-same"><summary>{len(same)} key{"s" if len(same) != 1 else ""} the same in '
        f"every run</summary><table>{head}{rows(same, '')}</table></details>"
        if same
        else ""
    )
    return f'<div class="config-diff"><div class="diff-note">{html.escape(note)}</div>{table}{folded}</div>'


def groups_frame(groups: list[dict]) -> pd.DataFrame:
    """The group list of one step: id, prompt (first line, shortened), reward mean and std."""

    def short(text: str) -> str:
        """The text on one line, cut to 90 characters."""
        line = " ".join(text.split())
        return line if len(line) <= 90 else line[:87] + "..."

    rows = [[g["group_id"], short(g["prompt"]), round(g["reward_mean"], 4), round(g["reward_std"], 4)] for g in groups]
    return pd.DataFrame(rows, columns=GROUP_COLUMNS)


def upload_preview_html(result: dict, uploaded: bool = True) -> str:
    """A dataset's path and row count, and its first rows (each cell cut to 60 characters): what an upload
    stored, or (``uploaded`` False) what the dataset field names."""

    def cell(text: str) -> str:
        """The text escaped, cut to 60 characters."""
        return html.escape(text if len(text) <= 60 else text[:57] + "...")

    rows = "".join(
        f"<tr><td>{cell(r['question'])}</td><td>{cell(r['answer'])}</td><td>{cell(r['solution'])}</td></tr>"
        for r in result["preview"]
    )
    head = (
        f"Stored {result['rows']} rows as {html.escape(result['dataset'])}"
        if uploaded
        else f"{html.escape(result['dataset'])}: {result['rows']} rows; the first {len(result['preview'])}:"
    )
    return (
        f'<div class="ok">{head}</div>'
        f'<table class="upload-preview"><tr><th>question</th><th>answer</th><th>solution</th></tr>{rows}</table>'
    )


def health_html(warnings: list[dict], steps: int | None = None, *, evaluation_only: bool = False) -> str:
    """The Run tab's health badge: "⚠ n warnings" unfolding into each warning (app.service.health: its title, message
    and the steps of its evidence; a click on one draws the metrics that show it, ``data-rule``); without any,
    by the run's ``steps`` of training recorded (None: not counted): "too few steps yet" before the first rule
    can fire (MIN_STEPS_RECENT), "no warnings so far" before every rule can (MIN_STEPS), else "no warnings"; an
    ``evaluation_only`` run (steps_per_iteration 0) has no training to judge.

    >>> health_html([])
    '<div class="health ok" data-warnings="0">✓ health: no warnings</div>'
    >>> health_html([], 2)
    '<div class="health wait" data-warnings="0" data-state="too-few">… health: too few steps yet (2 training steps; the first rules read 5, the others 10)</div>'
    """
    if evaluation_only:
        return '<div class="health ok" data-warnings="0" data-state="no-training">health: evaluation only, no training to judge</div>'
    if not warnings:
        if steps is not None and steps < MIN_STEPS_RECENT:
            return (
                '<div class="health wait" data-warnings="0" data-state="too-few">… health: too few steps yet '
                f"({steps} training step{'' if steps == 1 else 's'}; the first rules read {MIN_STEPS_RECENT}, the others "
                f"{MIN_STEPS})"
                "</div>"
            )
        if steps is not None and steps < MIN_STEPS:
            return (
                '<div class="health ok" data-warnings="0" data-state="partial">✓ health: no warnings so far '
                f"({steps} training steps; some rules wait for {MIN_STEPS})</div>"
            )
        return '<div class="health ok" data-warnings="0">✓ health: no warnings</div>'
    items = "".join(
        f'<li data-rule="{html.escape(w["rule"], quote=True)}" title="Click: chart {html.escape(", ".join(w["metrics"]), quote=True)}">'
        f"<b>{html.escape(w['title'])}</b> (steps {w['steps'][0]}–{w['steps'][1]}): {html.escape(w['message'])} "
        f'<span class="evidence">show {html.escape(", ".join(w["metrics"]))} ›</span></li>'
        for w in warnings
    )
    n = len(warnings)
    return (
        f'<details class="health warn" data-warnings="{n}"><summary>⚠ {n} health warning{"s" if n > 1 else ""}: '
        f"{html.escape(', '.join(w['title'] for w in warnings))}</summary><ul>{items}</ul>"
        '<div class="health-note">Each rule and its threshold: docs/diagnosing.md, "Health warnings". A click on a warning '
        "charts its metrics.</div></details>"
    )
