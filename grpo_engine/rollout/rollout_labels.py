"""Step labels without humans or a step checker: Math-Shepherd's rollouts (Wang et al., 2024).

A sampled output with steps s_1..s_K is labelled step by step. For each step k < K, a completer continues the
output N times from the prefix s_1..s_k; step k is labelled by

    hard estimation:  1 if any of the N continuations reaches the reference answer, else 0
    soft estimation:  the share of the N continuations that do

The last step is the output's own end: it is labelled by whether the output itself is right. "Reaches the
reference answer" is the verifier's verdict under the run's answer_match (``match``: rewards.final_answer).
Continuations of every step of every output are sampled in a few large batches (the prompts' keys and values are
computed once per prefix and shared by its N continuations: ``sampling.generate``).

The completer is the current policy (it continues from the exact tokens it sampled, the end of step k
included), or another local model (``label_completer``: a :class:`Completer`, which reads the question through
its own prompt template and the output's text up to the end of step k through its own tokenizer).

``labels_from_rollouts`` is the estimate on plain booleans, ``labels_from_shares`` on the shares that reached the
answer; ``rollout_shares`` samples and judges (the outputs as :class:`StepOutputs`, how they are continued as
:class:`Continuing`), ``rollout_verdicts`` does both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from grpo_engine.rewards.rewards import outcome_reward
from grpo_engine.rollout.outputs import Judged
from grpo_engine.rollout.sampling import generate
from grpo_engine.rollout.tokenization import completion_mask


@dataclass
class Completer:
    """A model other than the policy that continues outputs for rollout labels (``label_completer``): the model
    (frozen, on the run's device), its tokenizer, its prompt template (tokenization.prompt_formatter) and the
    tokens that end its outputs."""

    model: object
    tokenizer: object
    prompt: Callable[[str], str]
    end_ids: list[int]


@dataclass(frozen=True)
class Continuing:
    """How each step's continuations are sampled and read: ``n`` a step, up to ``max_new_tokens`` each, at
    ``temperature`` / ``top_p``, ending on ``end_ids`` (the policy's; a Completer brings its own), ``batch`` prefixes
    at once, their final answers read as ``match`` says (RunSpec.answer_match)."""

    n: int
    max_new_tokens: int
    temperature: float
    top_p: float
    end_ids: list[int]
    batch: int = 64
    match: str = "strict"

    @classmethod
    def for_run(cls, spec, end_ids: list[int]) -> Continuing:
        """A run's continuations: its label_rollouts a step, its max_new_tokens, temperature, top_p and
        answer_match (``spec``: a RunSpec), ending on the policy's ``end_ids``."""
        return cls(
            spec.label_rollouts, spec.max_new_tokens, spec.temperature, spec.top_p, end_ids, match=spec.answer_match
        )


@dataclass(frozen=True, kw_only=True)
class StepOutputs:
    """N sampled outputs to label step by step: ``completions`` (N, T) following ``prompt_ids`` / ``prompt_attn``
    (N, P), left-padded; ``step_ends[i]``: each step's last token index in output i; ``texts[i]``: its text;
    ``answers[i]``: its question's reference answer. A Completer also reads ``questions[i]`` and the output's token
    texts ``tokens[i]``."""

    prompt_ids: torch.Tensor
    prompt_attn: torch.Tensor
    completions: torch.Tensor
    step_ends: list[list[int]]
    texts: list[str]
    answers: list[str]
    questions: list[str] | None = None
    tokens: list[list[str]] | None = None

    @classmethod
    def judged(cls, prompt_ids, prompt_attn, completions, judged: Judged, rows: list[dict]) -> StepOutputs:
        """Sampled outputs as the verifier judged them (outputs.judge), for ``rows`` (their questions and answers)."""
        answers, questions = [r["answer"] for r in rows], [r["question"] for r in rows]
        return cls(
            prompt_ids=prompt_ids,
            prompt_attn=prompt_attn,
            completions=completions,
            step_ends=judged.step_ends,
            texts=judged.texts,
            answers=answers,
            questions=questions,
            tokens=judged.tokens,
        )


def labels_from_rollouts(right: list[list[bool]], estimate: str) -> list[float]:
    """One label per step from whether each of its continuations reached the answer.

    >>> labels_from_rollouts([[False, True, False, False], [False] * 4, [True] * 4], "hard")
    [1.0, 0.0, 1.0]
    >>> labels_from_rollouts([[False, True, False, False], [False] * 4, [True] * 4], "soft")
    [0.25, 0.0, 1.0]
    """
    return labels_from_shares([sum(r) / len(r) if r else 0.0 for r in right], estimate)


def labels_from_shares(shares: list[float], estimate: str) -> list[float]:
    """One label per step from the share of its continuations that reached the answer: 'hard' 1.0 when any did
    (a share above 0), 'soft' the share itself.

    >>> labels_from_shares([0.25, 0.0, 1.0], "hard"), labels_from_shares([0.25, 0.0, 1.0], "soft")
    ([1.0, 0.0, 1.0], [0.25, 0.0, 1.0])
    """
    if estimate == "hard":
        return [float(s > 0) for s in shares]
    return list(shares)


def _prefixes(prompt_ids, prompt_attn, completions, step_ends: list[list[int]]):
    """For every step but the last of every output: (output index, the prompt's token ids, the output's token ids
    up to and including the step's end)."""
    out = []
    for i, ends in enumerate(step_ends):
        prompt = prompt_ids[i][prompt_attn[i].bool()].tolist()
        for end in ends[:-1]:
            out.append((i, prompt, completions[i, : end + 1].tolist()))
    return out


def _completer_prefixes(
    completer: Completer, questions: list[str], tokens: list[list[str]], step_ends: list[list[int]]
):
    """``_prefixes`` in the completer's tokens: its prompt for output i's question, and the output's text up to
    and including the end of each step (``tokens[i]``: output i's token texts, which spell it) encoded by its
    tokenizer."""
    prompts: dict[str, list[int]] = {}
    out = []
    for i, ends in enumerate(step_ends):
        q = questions[i]
        if q not in prompts:
            prompts[q] = completer.tokenizer.encode(completer.prompt(q), add_special_tokens=False)
        for end in ends[:-1]:
            text = "".join(tokens[i][: end + 1])
            out.append((i, prompts[q], completer.tokenizer.encode(text, add_special_tokens=False)))
    return out


def _left_padded(rows: list[list[int]], pad: int, device) -> dict[str, torch.Tensor]:
    """Token id lists as a left-padded batch: input_ids and attention_mask, both (B, P)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    for b, row in enumerate(rows):
        ids[b, width - len(row) :] = torch.tensor(row)
        attn[b, width - len(row) :] = 1
    return {"input_ids": ids.to(device), "attention_mask": attn.to(device)}


@torch.no_grad()
def _continued_right(
    model, tokenizer, prefixes, answers: list[str], *, how: Continuing, end_ids: list[int], device
) -> list[list[bool]]:
    """For each prefix (output index, prompt ids, output ids so far): whether each of ``how.n`` continuations
    (ending on ``end_ids``) reaches the output's reference answer. ``how.batch`` prefixes are continued at once; each
    continued output is judged by the verifier (final answers read as ``how.match`` says) on its own text (the
    output so far, then the continuation up to its end token), never the prompt's."""
    n, batch, match = how.n, how.batch, how.match
    right: list[list[bool]] = []
    for start in range(0, len(prefixes), batch):
        chunk = prefixes[start : start + batch]
        prompts = _left_padded([p + o for _, p, o in chunk], tokenizer.pad_token_id, device)
        sampled = generate(
            model,
            tokenizer,
            prompts,
            repeat=n,
            max_new_tokens=how.max_new_tokens,
            greedy=False,
            temperature=how.temperature,
            top_p=how.top_p,
            end_ids=end_ids,
        )  # (len(chunk) * n, T')
        mask, ended = completion_mask(sampled, end_ids)
        content = (mask.sum(dim=1).long() - ended.long()).tolist()  # tokens before each end token
        rows = [chunk[k // n][2] + sampled[k, : content[k]].tolist() for k in range(len(content))]
        outputs = tokenizer.batch_decode(rows, skip_special_tokens=True)
        for j, (i, _, _) in enumerate(chunk):
            right.append(
                [outcome_reward(outputs[j * n + r], answers[i], match=match)[1]["correct"] > 0 for r in range(n)]
            )
    return right


def rollout_shares(
    model, tokenizer, outputs: StepOutputs, how: Continuing, *, completer: Completer | None = None
) -> list[list[float]]:
    """For each step of N sampled ``outputs``, the share of its ``how.n`` continuations that reach the reference
    answer; the last step's is the output's own verdict (1.0 or 0.0).

    ``model`` / ``tokenizer`` / ``how.end_ids``: the policy, which continues from its own tokens. With a
    ``completer``, that model continues instead, from each output's question and token texts (see
    :class:`Completer`)."""
    o = outputs
    if completer is None:
        prefixes = _prefixes(o.prompt_ids, o.prompt_attn, o.completions, o.step_ends)
        end_ids = how.end_ids
    else:
        model, tokenizer, end_ids = completer.model, completer.tokenizer, completer.end_ids
        prefixes = _completer_prefixes(completer, o.questions, o.tokens, o.step_ends)
    right = _continued_right(
        model, tokenizer, prefixes, o.answers, how=how, end_ids=end_ids, device=o.completions.device
    )
    shares = iter([sum(r) / len(r) for r in right])
    return [
        [next(shares) for _ in ends[:-1]]
        + ([float(outcome_reward(o.texts[i], o.answers[i], match=how.match)[1]["correct"] > 0)] if ends else [])
        for i, ends in enumerate(o.step_ends)
    ]


def rollout_verdicts(
    model, tokenizer, outputs: StepOutputs, how: Continuing, estimate: str, *, completer: Completer | None = None
) -> list[list[float]]:
    """The step labels of N sampled outputs: :func:`rollout_shares` made labels by ``estimate`` ('hard' or
    'soft', :func:`labels_from_shares`)."""
    return [
        labels_from_shares(s, estimate) for s in rollout_shares(model, tokenizer, outputs, how, completer=completer)
    ]
