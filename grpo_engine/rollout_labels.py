"""Step labels without humans or a step checker: Math-Shepherd's rollouts (Wang et al., 2024).

A sampled output with steps s_1..s_K is labelled step by step. For each step k < K, a completer (the current
policy) continues the output N times from the prefix s_1..s_k (the exact tokens sampled, the end of step k
included); step k is labelled by

    hard estimation:  1 if any of the N continuations reaches the reference answer, else 0
    soft estimation:  the share of the N continuations that do

The last step is the output's own end: it is labelled by whether the output itself is right. Continuations
of every step of every output are sampled in a few large batches (the prompts' keys and values are computed
once per prefix and shared by its N continuations: ``sampling.generate``).

``labels_from_rollouts`` is the estimate alone, on plain booleans; ``rollout_verdicts`` samples and judges.
"""
from __future__ import annotations

import torch

from .rewards import outcome_reward
from .sampling import generate
from .tokenization import completion_mask


def labels_from_rollouts(right: list[list[bool]], estimate: str) -> list[float]:
    """One label per step from whether each of its continuations reached the answer.

    >>> labels_from_rollouts([[False, True, False, False], [False] * 4, [True] * 4], "hard")
    [1.0, 0.0, 1.0]
    >>> labels_from_rollouts([[False, True, False, False], [False] * 4, [True] * 4], "soft")
    [0.25, 0.0, 1.0]
    """
    if estimate == "hard":
        return [float(any(r)) for r in right]
    return [sum(r) / len(r) if r else 0.0 for r in right]


def _prefixes(prompt_ids, prompt_attn, completions, step_ends: list[list[int]]):
    """For every step but the last of every output: (output index, the prompt's token ids, the output's token ids
    up to and including the step's end)."""
    out = []
    for i, ends in enumerate(step_ends):
        prompt = prompt_ids[i][prompt_attn[i].bool()].tolist()
        for end in ends[:-1]:
            out.append((i, prompt, completions[i, : end + 1].tolist()))
    return out


def _left_padded(rows: list[list[int]], pad: int, device) -> dict[str, torch.Tensor]:
    """Token id lists as a left-padded batch: input_ids and attention_mask, both (B, P)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    for b, row in enumerate(rows):
        ids[b, width - len(row):] = torch.tensor(row)
        attn[b, width - len(row):] = 1
    return {"input_ids": ids.to(device), "attention_mask": attn.to(device)}


@torch.no_grad()
def rollout_verdicts(model, tokenizer, prompt_ids, prompt_attn, completions, step_ends: list[list[int]],
                     texts: list[str], answers: list[str], *, n: int, estimate: str, max_new_tokens: int,
                     temperature: float, top_p: float, end_ids: list[int], batch: int = 64) -> list[list[float]]:
    """The step labels of N sampled outputs (``completions`` (N, T) after ``prompt_ids`` / ``prompt_attn``
    (N, P), left-padded; ``step_ends[i]``: each step's last token index in output i; ``texts[i]``: its text;
    ``answers[i]``: its question's reference answer), each step but the last by ``n`` continuations from its
    prefix (:func:`labels_from_rollouts`), the last by the output's own verdict. ``batch`` prefixes are
    continued at once; each continued output is judged by the verifier on its own text (the prefix of the
    output, then the continuation up to its end token), never on the prompt's."""
    prefixes = _prefixes(prompt_ids, prompt_attn, completions, step_ends)
    right: list[list[bool]] = []
    for start in range(0, len(prefixes), batch):
        chunk = prefixes[start:start + batch]
        prompts = _left_padded([p + o for _, p, o in chunk], tokenizer.pad_token_id, completions.device)
        sampled = generate(model, tokenizer, prompts, repeat=n, max_new_tokens=max_new_tokens, greedy=False,
                           temperature=temperature, top_p=top_p, end_ids=end_ids)  # (len(chunk) * n, T')
        mask, ended = completion_mask(sampled, end_ids)
        content = (mask.sum(dim=1).long() - ended.long()).tolist()  # tokens before each end token
        rows = [chunk[k // n][2] + sampled[k, : content[k]].tolist() for k in range(len(content))]
        outputs = tokenizer.batch_decode(rows, skip_special_tokens=True)
        for j, (i, _, _) in enumerate(chunk):
            right.append([outcome_reward(outputs[j * n + r], answers[i])[1]["correct"] > 0 for r in range(n)])
    labels = iter(labels_from_rollouts(right, estimate))
    return [[next(labels) for _ in ends[:-1]] + ([float(outcome_reward(texts[i], answers[i])[1]["correct"] > 0)]
                                                 if ends else [])
            for i, ends in enumerate(step_ends)]
