"""``python -m grpo_engine.rewards.reward_preview``: a run spec's named rewards on a few dataset rows, JSON in and JSON out.

The Launch tab's "Test rewards" (app.service.previews) runs this in a subprocess, so that a custom reward function never
runs inside the web process. It reads ``{rewards, rows, supervision, step_delimiter, max_new_tokens, answer_match}``
on stdin (``step_delimiter`` as text, its escapes already decoded), with ``rows`` dataset examples ``{question, answer, solution}``; each row's reference solution (its answer
when it has none) is scored as the completion. It writes ``{rows: [{row, question, completion, components, reward,
step_rewards}]}`` on stdout, or ``{error}`` when a reward cannot be loaded or fails. Whatever the reward functions
print goes to stderr. No torch.
"""

from __future__ import annotations

import json
import sys

from grpo_engine.rewards.builtin_rewards import accuracy_reward
from grpo_engine.rewards.reward_functions import RewardFunctionError, score_outputs


def preview(request: dict) -> dict:
    """Score ``request["rows"]`` with ``request["rewards"]``: each row's solution as the completion; no token count
    (``length`` counts characters / 4), ``correct`` the verifier's verdict on it under ``answer_match`` (strict when
    the request has none). With supervision 'process' the completion's steps are its pieces between step
    delimiters, ``reward`` is the mean step reward.

    >>> preview({"rewards": [{"name": "format", "weight": 2.0}], "max_new_tokens": 32,
    ...          "rows": [{"question": "2+3", "answer": "5", "solution": "2+3=5\\n#### 5"}]})["rows"][0]["reward"]
    2.0
    """
    process = request.get("supervision") == "process"
    delimiter = request.get("step_delimiter") or "\n"
    match = request.get("answer_match") or "strict"
    outputs = []
    for row in request["rows"]:
        completion = row.get("solution") or row["answer"]
        extra = {
            "solution": row.get("solution", ""),
            "max_new_tokens": request.get("max_new_tokens"),
            "answer_match": match,
            "correct": accuracy_reward(row["question"], completion, row["answer"], answer_match=match),
        }
        if process:
            extra["steps"] = [step for step in completion.split(delimiter) if step.strip()]
        outputs.append(
            {"question": row["question"], "completion": completion, "reference": row["answer"], "row": extra}
        )
    scored = score_outputs(tuple(request["rewards"]), outputs, process)
    rows = []
    for k, (out, (total, components)) in enumerate(zip(outputs, scored, strict=True)):
        step_rewards = total if process else None
        reward = (sum(total) / len(total) if total else 0.0) if process else total
        rows.append(
            {
                "row": k + 1,
                "question": out["question"],
                "completion": out["completion"],
                "components": components,
                "reward": reward,
                "step_rewards": step_rewards,
            }
        )
    return {"rows": rows}


def main() -> None:
    """Read the request on stdin, write the result (or ``{error}``) on stdout; the rewards' own output goes to
    stderr."""
    request = json.load(sys.stdin)
    out, sys.stdout = sys.stdout, sys.stderr  # a reward that prints must not break the JSON answer
    try:
        result = preview(request)
    except (RewardFunctionError, ValueError) as e:
        result = {"error": " ".join(str(e).split())}
    out.write(json.dumps(result))
    out.flush()


if __name__ == "__main__":
    main()
