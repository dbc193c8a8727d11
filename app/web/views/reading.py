"""What the verifier read from one sample and what each reward component paid, as the Groups tab's cards show
them (:func:`reading_html`, :func:`components_html`; the Find samples results say the same in text,
app.web.views.diagnose): the final answer it read under the run's answer_match and the rule that read it in words
(rewards.FORM_WORDS: strict ####, strict \\boxed{}, flexible last number, none), "not recorded" for a sample
recorded without its reading (its text is not read again here, under rules that may differ from the run's), and
every reward component with its value. Pure functions from app.service.api's dicts to HTML.
"""

import html

from grpo_engine.rewards.rewards import FORM_WORDS

# the verifier's components in words: key -> (words after a true / nonzero value, words after 0), and a tooltip
_COMPONENT_WORDS = {
    "correct": ("✓", "✗", "the verifier's verdict: 1 when the answer it read equals the reference"),
    "formatted": (
        "(#### or \\boxed stated)",
        "(no #### or \\boxed)",
        "1 when a final answer is stated in the strict form, #### line or \\boxed{}, whatever answer_match is",
    ),
}
SHOWN_ANSWER_CHARS = 80  # a read answer longer than this is cut on the card ("…"); its tooltip holds it whole


def reading_html(sample: dict) -> str:
    """The verifier's reading of one output, in a line: the final answer it read and the rule that read it in
    words (rewards.FORM_WORDS), "no final answer" where it read none, and "not recorded" for a sample recorded
    without its reading (the text is not read again here, under rules that may differ from the run's).

    >>> print(reading_html({"answer": "3", "answer_rule": "number"}))
    <div class="reading" data-answer-rule="number">verifier read <code class="answer" title="3">3</code> · by flexible last number</div>
    >>> reading_html({"answer": None, "answer_rule": "none"}).split(">", 1)[1]
    'verifier read no final answer (rule: none)</div>'
    >>> reading_html({}).split(">", 1)[1]
    "verifier's reading: not recorded</div>"
    """
    rule = sample.get("answer_rule")
    if rule is None:
        return '<div class="reading" data-answer-rule="">verifier\'s reading: not recorded</div>'
    head = f'<div class="reading" data-answer-rule="{html.escape(rule, quote=True)}">'
    words = html.escape(FORM_WORDS.get(rule, rule))
    answer = sample.get("answer")
    if answer is None:
        return f"{head}verifier read no final answer (rule: {words})</div>"
    shown = answer if len(answer) <= SHOWN_ANSWER_CHARS else answer[:SHOWN_ANSWER_CHARS] + "…"
    return (
        f'{head}verifier read <code class="answer" title="{html.escape(answer, quote=True)}">{html.escape(shown)}'
        f"</code> · by {words}</div>"
    )


def components_html(components: dict, weights: dict | None = None) -> str:
    """The reward's components, each with its value: the verifier's verdict (``correct 1 ✓``), whether a final
    answer is stated in the strict form (``formatted 0 (no #### or \\boxed)``), the format reward's share and,
    where a learned reward model scored the output, its score; a named reward of the run's ``rewards``
    (``weights``: name -> weight) as its value times its weight ("length 0.42 × 0.5"), then their weighted total;
    any other component by its key and value.

    >>> print(components_html({"correct": 0.0, "formatted": 1.0, "format": 0.1}))  # doctest: +ELLIPSIS
    <span class="verdict bad" ...>correct 0 ✗</span> <span ...>formatted 1 (#### or \\boxed stated)</span> <span ...>format reward +0.1</span>
    """
    weights = weights or {}
    parts = []
    for key, (yes, no, tip) in _COMPONENT_WORDS.items():
        if key in components:
            value = components[key]
            cls = ("ok" if value else "bad") if key == "correct" else "component"
            parts.append(
                f'<span class="verdict {cls}" data-component="{key}" title="{html.escape(tip, quote=True)}">'
                f"{key} {value:g} {html.escape(yes if value else no)}</span>"
            )
    if "format" in components:
        parts.append(f'<span class="component" data-component="format">format reward {components["format"]:+g}</span>')
    if "rm_score" in components:
        parts.append(
            f'<span class="rm-score" data-component="rm_score">reward model score {components["rm_score"]:.3f}</span>'
        )
    rest = {k: v for k, v in components.items() if k not in (*_COMPONENT_WORDS, "format", "rm_score")}
    parts += [
        f'<span class="component" data-component="{html.escape(k)}">{html.escape(k)} {v:.3g}'
        f"{f' × {weights[k]:g}' if k in weights else ''}</span>"
        for k, v in rest.items()
    ]
    named = [k for k in weights if k in components]
    if named:
        total = sum(components[k] * weights[k] for k in named)
        parts.append(f'<span class="component" data-component="weighted-total">weighted total {total:.3g}</span>')
    return " ".join(parts)
