"""The Launch tab's "Test rewards" and the ``/preview_rewards`` endpoint: a run spec's named rewards on the dataset's
first rows, each row's reference solution scored as the completion.

The scoring runs in a subprocess (``python -m grpo_engine.rewards.reward_preview``, JSON in and out, with a timeout): a custom
reward function is user code, and the web process neither runs it nor imports torch. Custom rewards are refused here
as at launch unless GRPO_ALLOW_CUSTOM_REWARDS is set (app.core.paths.check_custom_rewards).
"""

from __future__ import annotations

import html
import json
import subprocess
import sys
from typing import Any

from app.service.api import ApiError, parse_spec
from app.service.datasets import preview_dataset
from app.core.paths import check_custom_rewards
from app.core.settings import get_settings
from grpo_engine.spec.config import SpecError, validate_spec

PREVIEW_TIMEOUT_S = 60  # the subprocess's limit: loading the rewards and scoring the rows


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
        "step_delimiter": config["step_delimiter"],
        "max_new_tokens": config["max_new_tokens"],
        "answer_match": config["answer_match"],
    }
    result = _run_subprocess(request)
    return {
        "names": [r["name"] for r in config["rewards"]],
        "weights": {r["name"]: r["weight"] for r in config["rewards"]},
        "rows": result["rows"],
    }


def _run_subprocess(request: dict) -> dict:
    """``python -m grpo_engine.rewards.reward_preview`` on ``request``: its answer, or ApiError with its error, its last
    line of stderr, or the timeout."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "grpo_engine.rewards.reward_preview"],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=PREVIEW_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise ApiError(f"rewards: scoring {len(request['rows'])} rows took more than {PREVIEW_TIMEOUT_S} s") from None
    try:
        result = json.loads(done.stdout) if done.returncode == 0 else None
    except json.JSONDecodeError:
        result = None
    if result is None:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ApiError(f"rewards: the scoring process failed (exit {done.returncode}): {last[:300]}")
    if "error" in result:
        raise ApiError(f"rewards: {result['error']}")
    return result


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
