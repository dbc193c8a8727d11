"""A question tried by hand, as the Run tab's "Try a question" shows it: one column per model tried, side by side,
each with its G outputs as cards (the verifier's reading, the reward and its components, the tokens tinted by how
surprising each was to the model, -log pi, its log-prob in the token's tooltip). Pure functions from
app.service.tries' dicts to HTML; no Gradio, no store."""

import html
import math

from app.web.views.group import COLOURINGS, tinted_token
from app.web.views.reading import components_html, reading_html

SURPRISE_FULL = 5.0  # -log pi at which a token's tint is full (a token of probability e^-5, about 0.7%)


def token_html(token: str, logprob: float) -> str:
    """One token tinted by its surprise -log pi (full at SURPRISE_FULL, clear at 0), its text and log-prob in the
    tooltip.

    >>> token_html("7", -0.5)
    '<span class="token" data-tip="&#x27;7&#x27;  log π -0.5000 (p 0.607)" style="background:rgba(37,99,235,0.208)">7</span>'
    """
    tip = f"{token!r}  log π {logprob:.4f} (p {math.exp(logprob):.3g})"
    return tinted_token(token, -logprob / SURPRISE_FULL, COLOURINGS["logprob"][2], tip)  # the Groups tab's blue


def _output_html(i: int, out: dict, weights: dict) -> str:
    spans = []
    for token, logprob in zip(out["tokens"], out["logprobs"], strict=True):
        spans.append(token_html(token, logprob) + "<br>" * token.count("\n"))
    cut = "" if out["ended"] else ' · <span class="cut">cut at max_new_tokens</span>'
    reward = "not scored" if out["reward"] is None else f"<b>{out['reward']:+.3f}</b>"
    error = f'<div class="error">{html.escape(out["reward_error"])}</div>' if out.get("reward_error") else ""
    components = {k: v for k, v in out["components"].items() if v is not None}
    unjudged = " · correct not judged (no reference)" if out["components"].get("correct", 0) is None else ""
    return (
        f'<div class="sample try-output" data-reward="{out["reward"]}">'
        f'<div class="sample-head"><b>output {i + 1}</b> · reward {reward} · {len(out["tokens"])} tokens{cut}'
        f"{reading_html(out)}"
        f'<div class="verdicts">{components_html(components, weights)}{unjudged}</div>{error}</div>'
        f'<div class="tokens">{"".join(spans)}</div></div>'
    )


def _model_html(model: dict, weights: dict) -> str:
    outputs = model["outputs"]
    judged = [o["components"].get("correct") for o in outputs if o["components"].get("correct") is not None]
    right = f" · {int(sum(judged))}/{len(judged)} right" if judged else ""
    rewards = [o["reward"] for o in outputs if o["reward"] is not None]
    mean = f" · reward mean {sum(rewards) / len(rewards):+.3f}" if rewards else ""
    head = (
        f'<div class="try-head"><b>{html.escape(model["label"])}</b><br>{len(outputs)} outputs in '
        f"{model['seconds']:.1f} s{right}{mean}</div>"
    )
    cards = "".join(_output_html(i, o, weights) for i, o in enumerate(outputs))
    return f'<div class="try-model" data-model="{html.escape(model["model"], quote=True)}">{head}{cards}</div>'


def try_html(result: dict) -> str:
    """The try's models side by side (each named reward's value times its weight, from ``reward_weights``), under a
    line naming the question and its reference, and what the tint shows."""
    reference = result["reference"] or "none given: the verdict is not judged"
    head = (
        f'<div class="try-question">Try {result["try_id"]}: <b>{html.escape(result["question"])}</b>'
        f"<br>Reference: <code>{html.escape(reference)}</code></div>"
        f'<div class="tint-legend">Tint: surprise, -log π, 0<span class="tint-bar tint-logprob"></span>'
        f"{SURPRISE_FULL:g} or more (hover a token for its log-prob)</div>"
    )
    columns = "".join(_model_html(m, result.get("reward_weights") or {}) for m in result["models"])
    return f'<div class="try-result">{head}<div class="try-models">{columns}</div></div>'
