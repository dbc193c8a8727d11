"""The Launch tab's "Show the model's prompt" and the ``/preview_prompt`` endpoint: the run's first training question
exactly as the model will read it (question_template, system_prompt and prompt_template applied, the chat template's
special tokens included) with its length in tokens.

The tokenizer is loaded in a subprocess (``python -m grpo_engine.rewards.prompt_preview``, JSON in and out, with a timeout):
the web process never imports torch. A .gguf model is converted into the model cache on its first preview, as its
first run would.
"""

from __future__ import annotations

import html
import json
import subprocess
import sys
from pathlib import Path

from app.service.api import ApiError, parse_spec
from app.service.datasets import preview_dataset
from app.core.paths import check_spec_paths
from app.core.settings import get_settings
from grpo_engine.spec.config import BUILTIN_DATASET, SpecError, is_local_path, validate_spec

PREVIEW_TIMEOUT_S = 180  # loading a tokenizer; a .gguf model's first conversion takes about a minute on 2 cores
STAND_IN = "(a question of the dataset)"  # worded for a dataset not read here (a Hub id, a dataset directory)


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
    if config["dataset"] == BUILTIN_DATASET or not _read_by_the_worker(config["dataset"]):
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
    result = _run_subprocess(request)
    return {"model": config["model"], "question": question, "stand_in": stand_in, **result}


def _read_by_the_worker(dataset: str) -> bool:
    """Whether only the worker reads this dataset: a Hugging Face id or a local dataset directory (not previewed)."""
    return not is_local_path(dataset) or Path(dataset).expanduser().is_dir()


def _run_subprocess(request: dict) -> dict:
    """``python -m grpo_engine.rewards.prompt_preview`` on ``request``: its answer, or ApiError naming the model."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "grpo_engine.rewards.prompt_preview"],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=PREVIEW_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise ApiError(
            f"model: loading the tokenizer of {request['model']!r} took more than {PREVIEW_TIMEOUT_S} s"
        ) from None
    try:
        result = json.loads(done.stdout) if done.returncode == 0 else None
    except json.JSONDecodeError:
        result = None
    if result is None:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ApiError(
            f"model: the tokenizer of {request['model']!r} could not be loaded (exit {done.returncode}): {last[:300]}"
        )
    if "error" in result:
        raise ApiError(f"model: the tokenizer of {request['model']!r} could not be loaded: {result['error']}")
    return result


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
