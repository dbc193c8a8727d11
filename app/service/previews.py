"""The Launch tab's previews, and their endpoints: what a run spec would do, computed before it is launched.

* "Show the model's prompt" (``/preview_prompt``): the run's first training question exactly as the model will read
  it (question_template, system_prompt and prompt_template applied, the chat template's special tokens included) with
  its length in tokens. A .gguf model is converted into the model cache on its first preview, as its first run would.
* "Test rewards" (``/preview_rewards``): the spec's named rewards on the dataset's first rows, each row's reference
  solution scored as the completion. Custom rewards are refused here as at launch unless GRPO_ALLOW_CUSTOM_REWARDS
  is set (app.core.paths.check_custom_rewards).

Each runs the engine in a subprocess (:func:`run_json_subprocess`: ``python -m grpo_engine.rollout.prompt_preview`` or
``reward_preview``, JSON in and out, with a timeout): the web process never imports torch, and never runs a custom
reward function, which is user code.
"""

from __future__ import annotations

import html
import json
import subprocess
import sys
from typing import Any

from app.core.paths import check_custom_rewards, check_spec_paths, resolve_inside
from app.core.settings import get_settings
from app.service.api import ApiError, parse_spec
from app.service.datasets import preview_dataset, read_by_the_worker
from grpo_engine.spec.config import SpecError, is_gguf, validate_spec
from grpo_engine.spec.gguf_header import converted_dir
from grpo_engine.spec.words import decode_delimiter

PROMPT_TIMEOUT_S = 180  # loading a tokenizer; a .gguf model's first conversion takes about a minute on 2 cores
REWARDS_TIMEOUT_S = 60  # loading the rewards and scoring the rows
STAND_IN = "(a question of the dataset)"  # worded for a dataset not read here (a Hub id, a dataset directory)


def run_json_subprocess(module: str, request: dict, timeout: float, *, timed_out: str, failed: str) -> dict:
    """``python -m module`` with ``request`` as JSON on its stdin: the JSON object it prints (which may hold an
    "error"), or ApiError: ``timed_out`` past ``timeout`` seconds, ``failed`` with its exit status and its last line
    of stderr when it exits non-zero or prints no JSON."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", module], input=json.dumps(request), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        raise ApiError(timed_out) from None
    try:
        result = json.loads(done.stdout) if done.returncode == 0 else None
    except json.JSONDecodeError:
        result = None
    if not isinstance(result, dict):
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ApiError(f"{failed} (exit {done.returncode}): {last[:300]}")
    return result


def preview_prompt(spec: dict | str | None) -> dict:
    """The first training question of the spec's dataset as the spec's model reads it.

    Returns ``{model, question, prompt, token_count, special_tokens, stand_in}``: ``prompt`` the text the tokenizer
    encodes, ``token_count`` its tokens, ``special_tokens`` those it holds, ``stand_in`` true when the dataset is not
    read here (a Hugging Face id) and a stand-in question is worded instead. An invalid spec, a local path outside
    the roots and a tokenizer that cannot be loaded are refused (ApiError) with the reason."""
    settings = get_settings()
    try:
        config = validate_spec(parse_spec(spec)).to_dict()
        check_spec_paths(config, settings.path_roots)
    except SpecError as e:
        raise ApiError(str(e)) from None
    question, stand_in = STAND_IN, True
    if not read_by_the_worker(config["dataset"]):
        rows = preview_dataset(
            config["dataset"], config["question_field"], config["answer_field"], config["solution_field"]
        )["preview"]
        question, stand_in = rows[0]["question"], False
    request = {
        "model": config["model"],
        "cache_dir": str(settings.cache_dir),
        "question": question,
        **{k: config[k] for k in ("prompt_template", "system_prompt", "question_template")},
    }
    model = repr(request["model"])
    result = run_json_subprocess(
        "grpo_engine.rollout.prompt_preview",
        request,
        PROMPT_TIMEOUT_S,
        timed_out=f"model: loading the tokenizer of {model} took more than {PROMPT_TIMEOUT_S} s",
        failed=f"model: the tokenizer of {model} could not be loaded",
    )
    if "error" in result:
        raise ApiError(f"model: the tokenizer of {model} could not be loaded: {result['error']}")
    return {"model": config["model"], "question": question, "stand_in": stand_in, **result}


def conversion_notice(spec: dict | str | None) -> str | None:
    """What "Show the model's prompt" says while it waits on a first conversion: 'Converting NAME.gguf into a model
    directory (once, about a minute)…' where the spec's model is a .gguf file inside the path roots that the model
    cache has not converted yet (grpo_engine.spec.gguf_header.converted_dir); else None (a file outside the roots
    or missing is refused by :func:`preview_prompt`, which says why)."""
    try:
        spec = parse_spec(spec)
    except ApiError:
        return None
    model = spec.get("model") if isinstance(spec, dict) else None
    if not isinstance(model, str) or not is_gguf(model.strip()):
        return None
    settings = get_settings()
    try:
        path = resolve_inside("model", model.strip(), settings.path_roots)
    except SpecError:
        return None
    if not path.is_file() or converted_dir(path, settings.cache_dir).is_dir():
        return None
    return f"Converting {path.name} into a model directory (once, about a minute)…"


def prompt_html(result: dict) -> str:
    """The prompt as the model reads it, its special tokens marked, with its token count.

    >>> print(prompt_html({"prompt": "<s>2+3\\n", "token_count": 4, "special_tokens": ["<s>"], "stand_in": False}))
    <div class="prompt-preview"><div class="hint">The first training question as the model reads it: 4 tokens.</div><pre><mark class="special">&lt;s&gt;</mark>2+3
    </pre></div>
    """
    text = html.escape(result["prompt"])
    for token in sorted(result["special_tokens"], key=len, reverse=True):  # longest first: one never splits another
        escaped = html.escape(token)
        text = text.replace(escaped, f'<mark class="special">{escaped}</mark>')
    which = (
        "A stand-in question (the dataset is read by the worker)"
        if result["stand_in"]
        else "The first training question"
    )
    return (
        f'<div class="prompt-preview"><div class="hint">{which} as the model reads it: '
        f"{result['token_count']:,} tokens.</div><pre>{text}</pre></div>"
    )


def preview_rewards(spec: dict | str | None) -> dict:
    """Score the first rows of the spec's dataset (app.service.datasets.preview_dataset: at most 5) with its ``rewards``.

    Returns ``{names, weights, rows}``: the rewards' names in order, name -> weight, and per row ``{row, question,
    completion, components, reward, step_rewards}`` (``components`` each reward's own value, ``reward`` the weighted
    sum; process supervision: ``step_rewards`` each step's weighted sum and ``reward`` their mean). An invalid spec,
    empty ``rewards``, custom rewards that are not allowed, a dataset that is not previewed, and a reward that fails
    are refused (ApiError) with the reason."""
    settings = get_settings()
    try:
        config = validate_spec(parse_spec(spec)).to_dict()
        if not config["rewards"]:
            raise SpecError("rewards", 'is empty: name the rewards to test, e.g. [{"name": "accuracy", "weight": 1}]')
        check_custom_rewards(config, settings.path_roots, settings.allow_custom_rewards)
    except SpecError as e:
        raise ApiError(str(e)) from None
    rows = preview_dataset(
        config["dataset"], config["question_field"], config["answer_field"], config["solution_field"]
    )["preview"]
    request = {
        "rewards": list(config["rewards"]),
        "rows": rows,
        "supervision": config["supervision"],
        "step_delimiter": decode_delimiter(config["step_delimiter"]),
        "max_new_tokens": config["max_new_tokens"],
        "answer_match": config["answer_match"],
    }
    result = run_json_subprocess(
        "grpo_engine.rewards.reward_preview",
        request,
        REWARDS_TIMEOUT_S,
        timed_out=f"rewards: scoring {len(rows)} rows took more than {REWARDS_TIMEOUT_S} s",
        failed="rewards: the scoring process failed",
    )
    if "error" in result:
        raise ApiError(f"rewards: {result['error']}")
    return {
        "names": [r["name"] for r in config["rewards"]],
        "weights": {r["name"]: r["weight"] for r in config["rewards"]},
        "rows": result["rows"],
    }


def _cell(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, (int, float)) else html.escape(str(value))


def preview_html(result: dict) -> str:
    """The preview as a table: row, question, each reward's value (its weight in the header), the weighted total."""
    names, weights = result["names"], result["weights"]
    head = "".join(f"<th>{html.escape(n)} × {weights[n]:g}</th>" for n in names)
    body = []
    for row in result["rows"]:
        question = row["question"] if len(row["question"]) <= 120 else row["question"][:117] + "..."
        cells = "".join(f"<td>{_cell(row['components'].get(n, ''))}</td>" for n in names)
        body.append(
            f"<tr><td>{row['row']}</td><td>{html.escape(question)}</td>{cells}"
            f"<td><b>{_cell(row['reward'])}</b></td></tr>"
        )
    return (
        f'<table class="upload-preview reward-preview"><thead><tr><th>row</th><th>question</th>{head}'
        f"<th>weighted total</th></tr></thead><tbody>{''.join(body)}</tbody></table>"
        '<div class="hint">Each row\'s reference solution scored as the completion; length counts characters / 4 '
        "here (tokens in a run).</div>"
    )
