"""Two evaluations compared question by question (app.service.evaluations.compare_evals), as the Run tab shows them:
how many held-out questions were gained (wrong, then right), lost, right or wrong both times, then one folded row per
listed question: its verdicts and answers at both evaluations, unfolding into both greedy outputs side by side with
each sampled output's answer. Pure functions of the comparison: no store, no Gradio.
"""

from __future__ import annotations

import html

from grpo_engine.rewards.rewards import FORM_WORDS

FLIP_WORDS = {  # compare_evals' flips, as the view says them
    "gained": "wrong → right",
    "lost": "right → wrong",
    "right both": "right both times",
    "wrong both": "wrong both times",
}
FLIP_CHOICES = [("changed", "changed"), ("wrong → right", "gained"), ("right → wrong", "lost"),
                ("unchanged", "unchanged"), ("all", "all")]  # fmt: skip
QUESTION_CHARS = 140  # a folded row's question, cut


def verdict(output: dict) -> str:
    """An output's answer and verdict in a few characters.

    >>> verdict({"answer": "8", "correct": True}), verdict({"answer": None, "correct": False})
    ('8 ✓', 'no answer ✗')
    """
    answer = "no answer" if output["answer"] is None else output["answer"]
    return f"{answer} {'✓' if output['correct'] else '✗'}"


def _side(label: str, side: dict) -> str:
    greedy, samples = side["greedy"], side["samples"]
    rule = FORM_WORDS.get(greedy["answer_rule"], greedy["answer_rule"])
    sampled = ""
    if samples:
        right = sum(o["correct"] for o in samples)
        answers = " · ".join(html.escape(verdict(o)) for o in samples)
        sampled = f'<div class="eval-samples">{right} of {len(samples)} sampled right: {answers}</div>'
    return (
        f'<div class="eval-side"><div class="eval-head"><b>{html.escape(label)}</b> greedy: '
        f'{html.escape(verdict(greedy))} <span class="eval-rule">({html.escape(rule)})</span></div>'
        f'<pre class="eval-output">{html.escape(greedy["completion"])}</pre>{sampled}</div>'
    )


def counts_html(result: dict) -> str:
    """The comparison's counts in one line.

    >>> counts = {"gained": 3, "lost": 1, "right both": 10, "wrong both": 6, "only first": 0, "only second": 0}
    >>> counts_html({"first": {"run_id": 1, "step": 0}, "second": {"run_id": 1, "step": 20}, "counts": counts})
    '<div class="eval-counts">step 0 → step 20: <b>wrong → right 3</b> · <b>right → wrong 1</b> · right both times 10 · wrong both times 6</div>'
    """
    first, second, counts = result["first"], result["second"], result["counts"]

    def name(side: dict) -> str:
        same_run = first["run_id"] == second["run_id"]
        return f"step {side['step']}" if same_run else f"run {side['run_id']} step {side['step']}"

    parts = [f"<b>{FLIP_WORDS['gained']} {counts['gained']}</b>", f"<b>{FLIP_WORDS['lost']} {counts['lost']}</b>"]
    parts += [f"{FLIP_WORDS[k]} {counts[k]}" for k in ("right both", "wrong both")]
    parts += [f"only in {k.split()[1]} {counts[k]}" for k in ("only first", "only second") if counts[k]]
    return f'<div class="eval-counts">{name(first)} → {name(second)}: {" · ".join(parts)}</div>'


def flips_html(result: dict) -> str:
    """The counts, then one folded row per listed question (its flip, question and both greedy verdicts), unfolding
    into both outputs side by side."""
    first, second = result["first"], result["second"]
    labels = (f"step {first['step']}", f"step {second['step']}")
    if first["run_id"] != second["run_id"]:
        labels = (f"run {first['run_id']} step {first['step']}", f"run {second['run_id']} step {second['step']}")
    rows = []
    for row in result["rows"]:
        question = row["question"] if len(row["question"]) <= QUESTION_CHARS else row["question"][:QUESTION_CHARS] + "…"
        summary = (
            f'<span class="eval-flip-word">{html.escape(FLIP_WORDS[row["flip"]])}</span> '
            f'<span class="eval-question">{html.escape(question)}</span> '
            f'<span class="eval-verdicts">{html.escape(verdict(row["first"]["greedy"]))} → '
            f"{html.escape(verdict(row['second']['greedy']))} (reference {html.escape(row['reference'])})</span>"
        )
        body = f'<div class="eval-pair">{_side(labels[0], row["first"])}{_side(labels[1], row["second"])}</div>'
        rows.append(
            f'<details class="eval-flip" data-flip="{row["flip"]}"><summary>{summary}</summary>{body}</details>'
        )
    listed = "".join(rows) or '<div class="eval-none">No question of this kind between these evaluations.</div>'
    return f'<div class="eval-flips">{counts_html(result)}{listed}</div>'
