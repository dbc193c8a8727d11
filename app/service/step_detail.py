"""A process-supervised sample step by step: each reasoning step's text as the user saw it, the rules' label of
the step (with rollout labels, also the share of its continuations that reached the answer), the learned PRM's
score, and the step reward with its normalisation over the group.

Pure functions on the store's sample dicts (app.store.groups.sample_dict): app.service.api.get_group adds their
``steps`` to /get_group, and app.web.views.run draws them (the per-step table and the step marks' tooltips).
"""

from __future__ import annotations

from typing import Callable


def step_normaliser(samples: list[dict]) -> Callable[[float], float]:
    """The process rule's normalisation over every step reward of the group (GRPO_SPEC: (r - mean) / std, the
    population std; 0 when they are all equal), as a function of one reward.

    >>> norm = step_normaliser([{"step_rewards": [1.0, 1.0]}, {"step_rewards": [0.0, 1.0]}])
    >>> round(norm(1.0), 3), round(norm(0.0), 3)  # mean 0.75, std 0.4330
    (0.577, -1.732)
    """
    rewards = [r for s in samples for r in (s.get("step_rewards") or [])]
    if not rewards:
        return lambda r: 0.0
    mean = sum(rewards) / len(rewards)
    std = (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5
    return lambda r: (r - mean) / std if std > 0 else 0.0


def step_texts(tokens: list[str], ends: list[int]) -> list[str]:
    """The text of each step: step k spans tokens (end_{k-1}, end_k], the first from token 0, without the whitespace
    around it (the step delimiter, a newline by default, belongs to no step, as the engine cuts steps); tokens after
    the last step's end (the end token) belong to no step.

    >>> step_texts(["2", "+2", "=4", "\\n", "3", "*2", "=6", "<eos>"], [2, 6])
    ['2+2=4', '3*2=6']
    """
    texts, start = [], 0
    for end in ends:
        texts.append("".join(tokens[start : end + 1]).strip())
        start = end + 1
    return texts


def trained_step_rewards(advantages: list[float], ends: list[int]) -> list[float] | None:
    """Each step's normalised reward as the engine trained with it (whatever ``scale_rewards``), read back from the
    stored per-token advantages: a token's advantage is the sum of the normalised rewards of its step and every
    later one, so step k's is A[end_k] - A[end_k + 1] (0 past the end: the end token and padding carry none).
    None when the advantages do not cover the steps.

    >>> trained_step_rewards([0.5, 0.5, -0.25, 0.0], [1, 2])  # steps of normalised rewards +0.75 and -0.25
    [0.75, -0.25]
    """
    if not ends or len(advantages) <= ends[-1]:
        return None
    after = lambda t: advantages[t] if t < len(advantages) else 0.0  # noqa: E731
    return [round(advantages[e] - after(e + 1), 6) for e in ends]


def _at(values: list | None, k: int):
    """values[k], or None where the list is missing or shorter."""
    return values[k] if values is not None and k < len(values) else None


def sample_steps(sample: dict, norm: Callable[[float], float], prm: bool) -> list[dict]:
    """One dict per step of a sample: ``{index, text, label, share, prm_score, reward, normalised}``.

    ``index`` is 0-based; ``label`` / ``share`` come from the sample's ``step_labels`` / ``step_shares`` (None
    where absent); ``prm_score`` is the step reward when ``prm`` (a learned PRM scored the steps), else None;
    ``normalised`` is the reward as trained with, read from the advantages (:func:`trained_step_rewards`), or
    ``norm(reward)`` where they hold none (see :func:`step_normaliser`). An outcome sample has no steps: [].
    """
    ends = sample.get("step_end_indices") or []
    rewards = sample.get("step_rewards")
    trained = trained_step_rewards(sample.get("advantages") or [], ends)
    steps = []
    for k, text in enumerate(step_texts(sample["tokens"], ends)):
        reward = _at(rewards, k)
        normalised = None if reward is None else trained[k] if trained is not None else norm(reward)
        steps.append(
            {
                "index": k,
                "text": text,
                "label": _at(sample.get("step_labels"), k),
                "share": _at(sample.get("step_shares"), k),
                "prm_score": reward if prm else None,
                "reward": reward,
                "normalised": normalised,
            }
        )
    return steps


def step_details(samples: list[dict], prm: bool) -> list[list[dict]]:
    """Each sample's steps (:func:`sample_steps`), their rewards normalised over every step reward of the group.

    Two samples: step rewards [1, 0] and [1, 1, 0] (mean 0.6, population std sqrt(0.24) = 0.4899), so a reward
    of 1 normalises to 0.4 / 0.4899 = +0.816 and a reward of 0 to -0.6 / 0.4899 = -1.225:

    >>> a = {"tokens": ["1", "\\n", "2", "<eos>"], "step_end_indices": [1, 2], "step_rewards": [1.0, 0.0],
    ...      "step_labels": [1.0, 0.0], "step_shares": [0.75, 0.0]}
    >>> b = {"tokens": ["x", "\\n", "y", "\\n", "z"], "step_end_indices": [1, 3, 4], "step_rewards": [1.0, 1.0, 0.0]}
    >>> first, second = step_details([a, b], prm=False)
    >>> [(s["text"], s["label"], s["share"], s["prm_score"], round(s["normalised"], 3)) for s in first]
    [('1', 1.0, 0.75, None, 0.816), ('2', 0.0, 0.0, None, -1.225)]
    >>> [(s["index"], s["text"], s["label"], round(s["normalised"], 3)) for s in second]
    [(0, 'x', None, 0.816), (1, 'y', None, 0.816), (2, 'z', None, -1.225)]
    >>> [s["prm_score"] for s in step_details([a, b], prm=True)[1]]  # a learned PRM's scores are the step rewards
    [1.0, 1.0, 0.0]
    >>> step_details([{"tokens": ["4"], "step_end_indices": None, "step_rewards": None}], prm=False)  # outcome
    [[]]
    """
    norm = step_normaliser(samples)
    return [sample_steps(sample, norm, prm) for sample in samples]
