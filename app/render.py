"""The dashboard's renderers: plain functions from app.api's dicts to what the browser shows.

Tables as pandas frames (runs, groups, reward-model refreshes) and HTML strings (run progress with its phase
and key numbers, a group's completions coloured token by token, a banner over steps whose groups carry no
gradient, config differences, a dataset preview). The charts are app.charts'. Nothing here calls the store
or imports Gradio.
"""
import html
from datetime import datetime, timezone

import pandas as pd

from app.step_detail import step_details

GROUP_COLUMNS = ["group", "prompt", "reward mean", "reward std"]
# The reward-model table: each column's header and the recorded metric it shows ("change" is after - before)
RM_TABLE = (("iteration", "iteration"), ("step", "step"), ("rm/loss", "rm/loss"),
            ("accuracy before", "rm/accuracy_before"), ("accuracy after", "rm/accuracy_after"), ("change", None),
            ("examples", "rm/train_examples"), ("replayed", "rm/replayed"))
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


KEY_NUMBERS = ("reward_mean", "correct_frac", "eval/accuracy", "kl")  # the run header's line of latest values


def progress_html(run: dict, now: datetime | None = None, metrics: list[dict] | None = None) -> str:
    """Status badge and, while running, what the run is doing (its phase, with a bar of its own when it has a
    count); the progress bar, percentage, elapsed time and ETA, the worker (and attempt, after a resume) and
    the newest checkpoint; the latest key numbers of ``metrics`` (the run's metric rows); the error of a
    failed run."""
    now = now or datetime.now(timezone.utc)
    status, step, total = run["status"], run["step"] or 0, run["total_steps"] or 0
    pct = 100.0 * step / total if total else 0.0
    error = f'<pre class="run-error">{html.escape(run["error"])}</pre>' if run.get("error") else ""
    phase = run.get("phase") if status == "running" else None
    return (
        f'<div class="run-progress" data-status="{status}" data-step="{step}" data-total="{total}"'
        f' data-phase="{html.escape(phase or "")}">'
        f'<div class="run-title"><span class="badge {status}">{status}</span>'
        f'<b>#{run["run_id"]}</b> {html.escape(run["name"])}{_phase_html(run) if phase else ""}</div>'
        f'<div class="progress-track"><div class="progress-fill {status}" style="width:{pct:.1f}%"></div></div>'
        f'<div class="progress-text">{" · ".join(_progress_parts(run, now))}</div>'
        f'{_key_numbers_html(metrics or [])}{error}</div>'
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
    return (f'<span class="phase">{text} {done} / {total}<span class="phase-track">'
            f'<span class="phase-fill" style="width:{100.0 * done / total:.1f}%"></span></span></span>')


def _progress_parts(run: dict, now: datetime) -> list[str]:
    """The progress line's parts: iteration, step, percentage, the worker or the wait for one, the newest
    checkpoint, elapsed time and ETA (while training) or the run's duration (once finished)."""
    status, step, total = run["status"], run["step"] or 0, run["total_steps"] or 0
    started, finished = parse_time(run.get("started_at")), parse_time(run.get("finished_at"))
    parts = [f"step {step} / {total}", f"{100.0 * step / total if total else 0.0:.0f}%"]
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
        parts.append(f"elapsed {duration_text(elapsed)}")
        # ETA: the average time per finished step so far, times the steps left; before the first step is
        # done there is nothing to average, and while the run still prepares (its phase) none is promised
        if step:
            parts.append(f"ETA {duration_text(elapsed / step * (total - step))}")
        elif run.get("phase") in (None, "training"):
            parts.append("ETA: estimating")
        if run.get("cancel_requested"):
            parts.append("cancelling at the next step")
    elif started and finished:
        parts.append(f"ran {duration_text((finished - started).total_seconds())}")
    return parts


def _key_numbers_html(metrics: list[dict]) -> str:
    """The latest value of each KEY_NUMBERS metric in one line (with its step where it is older than the
    newest row's, e.g. the last evaluation); empty before any metric."""
    if not metrics:
        return ""
    newest = metrics[-1]["step"]
    parts = []
    for key in KEY_NUMBERS:
        row = next((m for m in reversed(metrics) if m.get(key) is not None), None)
        if row is not None:
            at = f' <span class="at">(step {row["step"]})</span>' if row["step"] != newest else ""
            parts.append(f'<span data-key="{key}">{key} <b>{row[key]:.3g}</b>{at}</span>')
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
        rows.append([change if key is None else _round(m.get(key)) if key in _RM_ROUNDED else m.get(key)
                     for _, key in RM_TABLE])
    return pd.DataFrame(rows, columns=RM_COLUMNS)


def _round(value, digits: int = 4):
    """``value`` rounded to ``digits`` decimals, None kept."""
    return None if value is None else round(float(value), digits)


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
        """The text on one line, cut to 90 characters."""
        line = " ".join(text.split())
        return line if len(line) <= 90 else line[:87] + "..."
    rows = [[g["group_id"], short(g["prompt"]), round(g["reward_mean"], 4), round(g["reward_std"], 4)]
            for g in groups]
    return pd.DataFrame(rows, columns=GROUP_COLUMNS)


def upload_preview_html(result: dict, uploaded: bool = True) -> str:
    """A dataset's path and row count, and its first rows (each cell cut to 60 characters): what an upload
    stored, or (``uploaded`` False) what the dataset field names."""
    def cell(text: str) -> str:
        """The text escaped, cut to 60 characters."""
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
    """One token on a background tinted red (A < 0) or green (A > 0), clear at A = 0, and its text and
    advantage in a tooltip (``data-tip``, shown by the stylesheet on hover).

    With f = |A| / scale (scale: the largest |A| in the group), the tint's opacity is 0.12 + 0.88 f for A != 0
    (the floor keeps small advantages visible, on a dark page too) and 0 for A = 0. The tint lies over the
    page's own background, so the page's text colour stays readable on the faint tints in light and dark
    themes; the strong tints (f over 0.6) carry white text.
    """
    f = min(abs(advantage) / scale, 1.0) if scale > 0 else 0.0
    alpha = 0.12 + 0.88 * f if f > 0 else 0.0
    r, g, b = (220, 38, 38) if advantage < 0 else (22, 163, 74)
    strong = " strong" if f > 0.6 else ""
    tip = html.escape(f"{token!r}  A = {advantage:+.4f}", quote=True)
    return (f'<span class="token{strong}" data-adv="{advantage:.6g}" data-tip="{tip}" '
            f'style="background:rgba({r},{g},{b},{alpha:.3f})">{_visible(token)}</span>')


# the reward components' names in words: key -> (text for a true / nonzero value, text for 0)
_COMPONENT_WORDS = {"correct": ("verifier: correct ✓", "verifier: wrong ✗"),
                    "formatted": ("final answer found", "no final answer found")}


def _verdicts(components: dict, weights: dict | None = None) -> str:
    """The reward's components in words: the verifier's verdict, whether a final answer was found, the
    format reward's share and, where a learned reward model scored the output, its score; a named reward of the
    run's ``rewards`` (``weights``: name -> weight) as its value times its weight ("length 0.42 × 0.5"), then
    their weighted total; any other component by its key."""
    weights = weights or {}
    parts = []
    for key, (yes, no) in _COMPONENT_WORDS.items():
        if key in components:
            cls = ("ok" if components[key] else "bad") if key == "correct" else "component"
            words = yes if components[key] else no
            parts.append(f'<span class="verdict {cls}" data-component="{key}">{words}</span>')
    if "format" in components:
        parts.append(f'<span class="component" data-component="format">format reward {components["format"]:+g}</span>')
    if "rm_score" in components:
        parts.append(f'<span class="rm-score" data-component="rm_score">reward model score '
                     f'{components["rm_score"]:.3f}</span>')
    rest = {k: v for k, v in components.items() if k not in (*_COMPONENT_WORDS, "format", "rm_score")}
    parts += [f'<span class="component" data-component="{html.escape(k)}">{html.escape(k)} {v:.3g}'
              f'{f" × {weights[k]:g}" if k in weights else ""}</span>' for k, v in rest.items()]
    named = [k for k in weights if k in components]
    if named:
        total = sum(components[k] * weights[k] for k in named)
        parts.append(f'<span class="component" data-component="weighted-total">weighted total {total:.3g}</span>')
    return " ".join(parts)


def zero_spread_banner(groups: list[dict]) -> str:
    """A warning when most (over half) of a step's groups (app.api.list_groups rows) have the same reward for
    every output (every step, with process supervision: ``reward_std`` is over the step rewards): their
    advantages are 0, so they teach the policy nothing; empty otherwise."""
    flat = sum(1 for g in groups if g["reward_std"] == 0)
    if not groups or 2 * flat <= len(groups):
        return ""
    return (f'<div class="zero-spread" data-flat="{flat}" data-groups="{len(groups)}"><b>{flat} of {len(groups)} '
            'groups at this step have the same reward for every output (or every step)</b>: they carry no '
            'gradient. Try a harder '
            'or easier dataset, a larger group_size, or a higher temperature.</div>')


def _prompt_html(group: dict) -> str:
    """The prompt as the model saw it (after the run's prompt template: a chat template's turns, a BOS token), and
    the question on its own when the two differ; the question alone for groups recorded without it, or when the
    template only added white space."""
    question = f'<pre class="prompt">{html.escape(group["prompt"])}</pre>'
    seen = group.get("model_prompt")
    if not seen or seen.strip() == group["prompt"].strip():  # the plain template only adds a line break
        return f"<div>Prompt:</div>{question}"
    return (f'<div>Prompt as the model saw it (the run\'s prompt template applied):</div>'
            f'<pre class="prompt model-prompt">{html.escape(seen)}</pre>'
            f'<details class="question"><summary>the question alone</summary>{question}</details>')


def _process_head(group: dict) -> str:
    """The group head's words on process supervision, with where the step rewards came from."""
    source = f" (from {html.escape(group['step_labels'])})" if group.get("step_labels") else ""
    return f" · process supervision: step rewards at each step end{source}"


def _share_text(step: dict) -> str:
    """A step's rules' label, with the share of its continuations that reached the answer where that says more
    (a hard label; a soft one is the share itself): "1 · 0.75", "0.75", "1"; "–" for none.

    >>> _share_text({"label": 1.0, "share": 0.75}), _share_text({"label": 0.75, "share": 0.75})
    ('1 · 0.75', '0.75')
    """
    label, share = step.get("label"), step.get("share")
    if label is None:
        return "–"
    return f"{label:.3g}" if share is None or share == label else f"{label:.3g} · {share:.3g}"


def _step_mark(step: dict, source: str | None) -> str:
    """The mark after a step's last token: its reward, and on hover its reward's source, the normalised reward
    and the rules' label (with the share of the step's continuations that reached the answer).

    >>> _step_mark({"index": 1, "reward": 1.0, "normalised": 0.5, "label": None, "share": None}, "rollouts")
    '<span class="step-end" data-tip="step 2: reward +1.000 from rollouts; normalised +0.500">step 2 r=+1.00</span>'
    >>> tip = _step_mark({"index": 0, "reward": 0.8, "normalised": 1.0, "label": 1.0, "share": 0.75}, None)
    >>> tip.split('"')[3]
    'step 1: reward +0.800; normalised +1.000; label 1; share reaching the answer 0.75'
    """
    k, reward = step["index"], step["reward"]
    if reward is None:
        return f'<span class="step-end">step {k + 1}</span>'
    tip = f"step {k + 1}: reward {reward:+.3f}{f' from {source}' if source else ''}"
    tip += f"; normalised {step['normalised']:+.3f}"
    if step["label"] is not None:
        tip += f"; label {step['label']:.3g}"
    if step["share"] is not None:
        tip += f"; share reaching the answer {step['share']:.3g}"
    return f'<span class="step-end" data-tip="{html.escape(tip, quote=True)}">step {k + 1} r={reward:+.2f}</span>'


def _step_table(steps: list[dict], rule: str | None) -> str:
    """A process sample's steps as a table (folded open; its rule named above it): step, text, the rules' label,
    the PRM's score (when a learned PRM scored the steps) and the reward with its normalised value."""
    if not steps:
        return ""
    labels = any(st["label"] is not None for st in steps)
    prm = any(st["prm_score"] is not None for st in steps)
    rule_text = f' · labels by <span class="src">{html.escape(rule)}</span>' if rule and labels else ""
    head = ("<th>step</th><th>text</th>" + ("<th>label</th>" if labels else "")
            + ("<th>PRM score</th>" if prm else "") + "<th>reward (normalised)</th>")
    rows = []
    for st in steps:
        text = html.escape(st["text"].strip()) or '<span class="ws">∅</span>'
        cells = [f'<td class="num">{st["index"] + 1}</td>', f'<td class="text">{text}</td>']
        if labels:
            cells.append(f'<td class="num" data-col="label">{_share_text(st)}</td>')
        if prm:
            score = "–" if st["prm_score"] is None else f'{st["prm_score"]:.3f}'
            cells.append(f'<td class="num" data-col="prm">{score}</td>')
        reward = "–" if st["reward"] is None else f'{st["reward"]:+.2f} ({st["normalised"]:+.2f})'
        cells.append(f'<td class="num" data-col="reward">{reward}</td>')
        rows.append(f'<tr data-step="{st["index"]}">{"".join(cells)}</tr>')
    return (f'<details class="steps" open><summary>{len(steps)} steps{rule_text}</summary>'
            f'<table class="step-table"><tr>{head}</tr>{"".join(rows)}</table></details>')


def _steps_of(samples: list[dict]) -> list[list[dict]]:
    """Each sample's steps: /get_group's ``steps``, or, for dicts without them, the same computed here (no PRM)."""
    if all(s.get("steps") is not None for s in samples):
        return [s["steps"] for s in samples]
    return step_details(samples, prm=False)


def group_html(group: dict) -> str:
    """The prompt, the reference and the G completions side by side, tokens coloured by advantage.

    Each completion shows its raw reward and, when one reward per output was normalised (outcome
    supervision), the normalised one: the engine's advantage, the same on every token (each completion has
    at least its end token); process supervision marks each step's end with its reward, and lists the steps
    under the completion in a table (text, the rules' label, the PRM's score, the reward normalised).
    """
    samples = group["samples"]
    scale = max((abs(a) for s in samples for a in s["advantages"]), default=0.0)
    rewards = [s["reward"] for s in samples]
    mean = sum(rewards) / len(rewards) if rewards else 0.0
    process = any(s.get("step_end_indices") is not None for s in samples)
    steps_of = _steps_of(samples)
    weights = group.get("reward_weights") or {}  # the run's named rewards: name -> weight
    out = [
        f'<div class="group" data-group-id="{group["group_id"]}">',
        '<div class="group-head">',
        f'<b>Group {group["group_id"]}</b> · run {group["run_id"]} · step {group["step"]} · '
        f'{len(samples)} samples · reward mean {mean:.3f}'
        f'{_process_head(group) if process else ""}',
        _prompt_html(group),
        f'<div>Reference: <code>{html.escape(str(group.get("reference") or ""))}</code></div>',
        f'<div>Advantage: {-scale:+.3f}<span class="adv-legend"></span>{scale:+.3f} '
        f'(hover a token for its value)</div></div><div class="samples{" process" if process else ""}">',
    ]
    for i, (sample, steps) in enumerate(zip(samples, steps_of)):
        end_at = {t: k for k, t in enumerate(sample.get("step_end_indices") or [])}
        spans = []
        for t, (token, adv) in enumerate(zip(sample["tokens"], sample["advantages"])):
            spans.append(token_span(token, adv, scale))
            if t in end_at:
                spans.append(_step_mark(steps[end_at[t]], group.get("step_labels")))
            spans.append("<br>" * token.count("\n"))  # the line break after the token and its step mark
        if process:
            count = len(sample.get("step_rewards") or [])
            reward_text = f'reward <b>{sample["reward"]:+.3f}</b> (mean of {count} step rewards)'
        else:
            # outcome supervision: every token carries the reward the engine normalised within the group
            normalised = f'{sample["advantages"][0]:+.3f}' if sample["advantages"] else "n/a"
            reward_text = f'reward <b>{sample["reward"]:+.3f}</b> · normalised <b class="norm">{normalised}</b>'
        out.append(
            f'<div class="sample" data-sample-id="{sample["sample_id"]}" data-reward="{sample["reward"]:.6g}">'
            f'<div class="sample-head"><b>sample {i + 1}</b> · {reward_text} · {len(sample["tokens"])} tokens'
            f'<div class="verdicts">{_verdicts(sample.get("reward_components") or {}, weights)}</div></div>'
            f'<div class="tokens">{"".join(spans)}</div>{_step_table(steps, group.get("step_label_rule"))}</div>'
        )
    out.append("</div></div>")
    return "".join(out)
