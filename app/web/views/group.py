"""One recorded group as the Groups tab shows it: the prompt, the reference and the G completions side by side,
each token tinted by the quantity picked (its advantage, the KL to the reference, or how surprising it was to the
policy) with every per-token number in its tooltip; process samples' step marks and step tables; the banner over
steps whose groups carry no gradient. Pure functions from app.service.api's dicts to HTML; no Gradio, no store."""

import html

from app.service.health import zero_spread_cause
from app.service.step_detail import step_details
from app.web.views.reading import components_html, reading_html

# What a token's tint can show: key -> (words, the per-sample list it reads, the tint's colour as r, g, b)
COLOURINGS = {
    "advantage": ("advantage", "advantages", None),  # red below 0, green above
    "kl": ("KL to the reference (k3)", "kls", (234, 88, 12)),  # orange, stronger where the policy drifted
    "logprob": ("surprise, -log π_old", "logprobs", (37, 99, 235)),  # blue, stronger where sampling was unlikely
}


def visible_token(token: str) -> str:
    """HTML for a token's text: escaped; spaces stay spaces (the text wraps between words, as it reads), tabs,
    carriage returns and newlines are drawn as marks (the line break itself follows the token), an empty token
    as ∅. A token's exact text, spaces included, is in its tooltip."""
    if token == "":
        return '<span class="ws">∅</span>'
    text = html.escape(token)
    return (
        text.replace("\t", '<span class="ws">→</span>')
        .replace("\r", '<span class="ws">␍</span>')
        .replace("\n", '<span class="ws">↵</span>')
    )


def token_span(
    token: str,
    advantage: float,
    scale: float,
    detail: dict | None = None,
    tint: tuple[float, tuple[int, int, int]] | None = None,
) -> str:
    """One token on a tinted background, and its text, advantage and the update's numbers (``detail``: logprob,
    ref_logprob, ratio, kl, clipped; :func:`token_tip`) in a tooltip (``data-tip``, shown by the stylesheet).

    The tint: by default red (A < 0) or green (A > 0), clear at A = 0, with f = |A| / scale (scale: the largest
    |A| in the group); ``tint`` = (f, colour) gives another quantity's f and colour instead (:func:`tinted_token`).

    >>> token_span("7", 0.5, 1.0, {"logprob": -0.25, "ref_logprob": -0.5, "ratio": 1.0, "kl": 0.03,
    ...                            "clipped": False}).split('"')[5]
    '&#x27;7&#x27;  A = +0.5000 · log π_old -0.2500 · log π_ref -0.5000 · ratio 1.000 · KL 0.0300'
    """
    if tint is None:
        f = abs(advantage) / scale if scale > 0 else 0.0
        rgb = (220, 38, 38) if advantage < 0 else (22, 163, 74)
    else:
        f, rgb = tint
    tip = token_tip(token, advantage, detail or {})
    return tinted_token(token, f, rgb, tip, f' data-adv="{advantage:.6g}"')


def tinted_token(token: str, f: float, rgb: tuple[int, int, int], tip: str, attributes: str = "") -> str:
    """A token's span on a tint of ``rgb`` at strength ``f`` (clamped to 0..1), ``tip`` its tooltip (``data-tip``,
    shown by the stylesheet), ``attributes`` more of the span's attributes. The opacity is 0.12 + 0.88 f for f > 0
    (the floor keeps small values visible, on a dark page too) and 0 at f = 0. The tint lies over the page's own
    background, so the page's text colour stays readable on the faint tints in light and dark themes; the strong
    tints (f over 0.6) carry white text.

    >>> tinted_token("7", 0.5, (1, 2, 3), "seven")
    '<span class="token" data-tip="seven" style="background:rgba(1,2,3,0.560)">7</span>'
    """
    f = min(max(f, 0.0), 1.0)
    alpha = 0.12 + 0.88 * f if f > 0 else 0.0
    strong = " strong" if f > 0.6 else ""
    r, g, b = rgb
    return (
        f'<span class="token{strong}"{attributes} data-tip="{html.escape(tip, quote=True)}" '
        f'style="background:rgba({r},{g},{b},{alpha:.3f})">{visible_token(token)}</span>'
    )


def token_tip(token: str, advantage: float, detail: dict) -> str:
    """A token's tooltip: its text and advantage, then what the update saw where it was recorded: the policy's
    log-prob at sampling (log π_old), the reference's, the ratio π_θ / π_old and the k3 KL at the last update,
    and "clipped" where the clip bound the update.

    >>> token_tip(" 4", -1.0, {"logprob": -2.0, "ratio": 1.3, "clipped": True})
    "' 4'  A = -1.0000 · log π_old -2.0000 · ratio 1.300 · clipped"
    """
    parts = [f"{token!r}  A = {advantage:+.4f}"]
    for key, words, fmt in (
        ("logprob", "log π_old", "{:+.4f}"),
        ("ref_logprob", "log π_ref", "{:+.4f}"),
        ("ratio", "ratio", "{:.3f}"),
        ("kl", "KL", "{:.4f}"),
    ):
        if detail.get(key) is not None:
            parts.append(f"{words} {fmt.format(detail[key])}")
    if detail.get("clipped"):
        parts.append("clipped")
    return " · ".join(parts)


def sample_detail(sample: dict, t: int) -> dict:
    """Token ``t``'s recorded numbers from a /get_group sample (None where a quantity was not recorded)."""

    def at(name):
        values = sample.get(name)
        return values[t] if values is not None and t < len(values) else None

    return {
        "logprob": at("logprobs"),
        "ref_logprob": at("ref_logprobs"),
        "ratio": at("ratios"),
        "kl": at("kls"),
        "clipped": at("clipped"),
    }


def _cut_mark(sample: dict) -> str:
    """' · cut at max_new_tokens' (marked) for an output that reached the length limit without an end token."""
    if not sample.get("truncated"):
        return ""
    return (
        ' · <span class="cut" title="the output reached max_new_tokens without an end token: it has no '
        'final answer, and its reward says so">cut at max_new_tokens</span>'
    )


def flat_groups(groups: list[dict]) -> int:
    """How many of a step's groups (app.service.api.list_groups rows) have the same reward for every output (every step,
    with process supervision: ``reward_std`` is over the step rewards)."""
    return sum(1 for g in groups if g["reward_std"] == 0)


def zero_spread_banner(groups: list[dict], cause: str = "") -> str:
    """A warning when most (over half) of a step's groups have the same reward for every output
    (:func:`flat_groups`): their advantages are 0, so they teach the policy nothing; empty otherwise. ``cause``:
    the step's evidence in words, with the key to change (app.service.health.zero_spread_cause; without it, that
    function's general sentence)."""
    flat = flat_groups(groups)
    if not groups or 2 * flat <= len(groups):
        return ""
    return (
        f'<div class="zero-spread" data-flat="{flat}" data-groups="{len(groups)}"><b>{flat} of {len(groups)} '
        "groups at this step have the same reward for every output (or every step)</b>: they carry no "
        f"gradient. {html.escape(cause or zero_spread_cause([], {}))}</div>"
    )


def _prompt_html(group: dict) -> str:
    """The prompt as the model saw it (after the run's prompt template: a chat template's turns, a BOS token), and
    the question on its own when the two differ; the question alone for groups recorded without it, or when the
    template only added white space."""
    question = f'<pre class="prompt">{html.escape(group["prompt"])}</pre>'
    seen = group.get("model_prompt")
    if not seen or seen.strip() == group["prompt"].strip():  # the plain template only adds a line break
        return f"<div>Prompt:</div>{question}"
    return (
        f"<div>Prompt as the model saw it (the run's prompt template applied):</div>"
        f'<pre class="prompt model-prompt">{html.escape(seen)}</pre>'
        f'<details class="question"><summary>the question alone</summary>{question}</details>'
    )


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
    head = (
        "<th>step</th><th>text</th>"
        + ("<th>label</th>" if labels else "")
        + ("<th>PRM score</th>" if prm else "")
        + "<th>reward (normalised)</th>"
    )
    rows = []
    for st in steps:
        text = html.escape(st["text"].strip()) or '<span class="ws">∅</span>'
        cells = [f'<td class="num">{st["index"] + 1}</td>', f'<td class="text">{text}</td>']
        if labels:
            cells.append(f'<td class="num" data-col="label">{_share_text(st)}</td>')
        if prm:
            score = "–" if st["prm_score"] is None else f"{st['prm_score']:.3f}"
            cells.append(f'<td class="num" data-col="prm">{score}</td>')
        reward = "–" if st["reward"] is None else f"{st['reward']:+.2f} ({st['normalised']:+.2f})"
        cells.append(f'<td class="num" data-col="reward">{reward}</td>')
        rows.append(f'<tr data-step="{st["index"]}">{"".join(cells)}</tr>')
    return (
        f'<details class="steps" open><summary>{len(steps)} steps{rule_text}</summary>'
        f'<table class="step-table"><tr>{head}</tr>{"".join(rows)}</table></details>'
    )


def _steps_of(samples: list[dict]) -> list[list[dict]]:
    """Each sample's steps: /get_group's ``steps``, or, for dicts without them, the same computed here (no PRM)."""
    if all(s.get("steps") is not None for s in samples):
        return [s["steps"] for s in samples]
    return step_details(samples, prm=False)


def _rm_head(group: dict) -> str:
    """The group head's words on the learned reward model that scored it (none without one)."""
    version = group.get("rm_version")
    return f' · scored by <span class="rm-version">reward model v{version}</span>' if version else ""


def _tints(samples: list[dict], colour: str) -> list[list | None]:
    """Each sample's per-token tint (f, colour) for ``colour`` (a COLOURINGS key; None: by advantage). f is the token's value over the group's largest: KL as it is,
    log-prob as the surprise -log π_old."""
    if colour == "advantage" or colour not in COLOURINGS:
        return [None] * len(samples)
    _, field, rgb = COLOURINGS[colour]
    sign = -1.0 if colour == "logprob" else 1.0
    values = [[sign * v for v in s[field]] if s.get(field) is not None else None for s in samples]
    top = max((v for vs in values if vs for v in vs), default=0.0)
    return [
        [(0.0, rgb)] * len(s["advantages"]) if vs is None else [((v / top) if top > 0 else 0.0, rgb) for v in vs]
        for s, vs in zip(samples, values, strict=True)
    ]  # a sample without the quantity stays clear


def _legend(samples: list[dict], colour: str, scale: float) -> str:
    """The line under the group head that says what the tint shows and its range."""
    if colour in COLOURINGS and colour != "advantage":
        words, field, _ = COLOURINGS[colour]
        values = [v for s in samples for v in (s.get(field) or [])]
        if not values:
            return (
                f'<div class="tint-legend">Tint: {words}: not recorded for these samples (recorded from this '
                f"version on{'; none without a reference, kl_coef 0' if colour == 'kl' else ''}); "
                "tokens are not tinted.</div>"
            )
        top = max(-v for v in values) if colour == "logprob" else max(values)
        return (
            f'<div class="tint-legend">Tint: {words}, 0<span class="tint-bar tint-{colour}"></span>{top:.3f} '
            "(hover a token for every number)</div>"
        )
    return (
        f'<div>Advantage: {0.0 - scale:+.3f}<span class="adv-legend"></span>{scale:+.3f} '  # 0.0 -: no -0.000
        "(hover a token for its numbers)</div>"
    )


def group_html(group: dict, colour: str = "advantage") -> str:
    """The prompt, the reference and the G completions side by side, tokens tinted by ``colour`` (COLOURINGS:
    advantage, kl or logprob); each token's tooltip holds its advantage and the update's numbers.

    Each completion shows its raw reward and, when one reward per output was normalised (outcome
    supervision), the normalised one: the engine's advantage, the same on every token (each completion has
    at least its end token); process supervision marks each step's end with its reward, and lists the steps
    under the completion in a table (text, the rules' label, the PRM's score, the reward normalised).
    """
    samples = group["samples"]
    scale = max((abs(a) for s in samples for a in s["advantages"]), default=0.0)
    tints = _tints(samples, colour)
    rewards = [s["reward"] for s in samples]
    mean = sum(rewards) / len(rewards) if rewards else 0.0
    process = any(s.get("step_end_indices") is not None for s in samples)
    steps_of = _steps_of(samples)
    weights = group.get("reward_weights") or {}  # the run's named rewards: name -> weight
    out = [
        f'<div class="group" data-group-id="{group["group_id"]}">',
        '<div class="group-head">',
        f"<b>Group {group['group_id']}</b> · run {group['run_id']} · step {group['step']} · "
        f"{len(samples)} samples · reward mean {mean:.3f}"
        f"{_process_head(group) if process else ''}"
        f"{_rm_head(group)}",
        _prompt_html(group),
        f"<div>Reference: <code>{html.escape(str(group.get('reference') or ''))}</code></div>",
        _legend(samples, colour, scale),
        f'</div><div class="samples{" process" if process else ""}">',
    ]
    for i, (sample, steps, tint) in enumerate(zip(samples, steps_of, tints, strict=True)):
        end_at = {t: k for k, t in enumerate(sample.get("step_end_indices") or [])}
        spans = []
        for t, (token, adv) in enumerate(zip(sample["tokens"], sample["advantages"], strict=True)):
            spans.append(
                token_span(
                    token, adv, scale, sample_detail(sample, t), tint[t] if tint is not None and t < len(tint) else None
                )
            )
            if t in end_at:
                spans.append(_step_mark(steps[end_at[t]], group.get("step_labels")))
            spans.append("<br>" * token.count("\n"))  # the line break after the token and its step mark
        if process:
            count = len(sample.get("step_rewards") or [])
            reward_text = f"reward <b>{sample['reward']:+.3f}</b> (mean of {count} step rewards)"
        else:
            # outcome supervision: every token carries the reward the engine normalised within the group
            normalised = f"{sample['advantages'][0]:+.3f}" if sample["advantages"] else "n/a"
            reward_text = f'reward <b>{sample["reward"]:+.3f}</b> · normalised <b class="norm">{normalised}</b>'
        out.append(
            f'<div class="sample" data-sample-id="{sample["sample_id"]}" data-reward="{sample["reward"]:.6g}">'
            f'<div class="sample-head"><b>sample {i + 1}</b> · {reward_text} · {len(sample["tokens"])} tokens'
            f"{_cut_mark(sample)}{reading_html(sample)}"
            f'<div class="verdicts">{components_html(sample.get("reward_components") or {}, weights)}</div></div>'
            f'<div class="tokens">{"".join(spans)}</div>{_step_table(steps, group.get("step_label_rule"))}</div>'
        )
    out.append("</div></div>")
    return "".join(out)
