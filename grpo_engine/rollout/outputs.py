"""The sampled outputs as the step reads them: prompts encoded, the log-probabilities of completion tokens under a
model, completions decoded, and the rules' verdicts on them (the verifier's, and each step's by the run's step
checker), with the reward model's view of judged outputs.

Shapes: N sequences, P prompt tokens, T completion tokens, V the vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from grpo_engine.data.builtin_task import STEP_DELIMITER, check_step
from grpo_engine.data.data import format_prompt
from grpo_engine.rewards.rewards import final_answer, reading_reward
from grpo_engine.rewards.step_check import step_equations_hold
from grpo_engine.rollout.tokenization import step_boundaries, token_pieces

LOGPROB_CHUNK = 8  # completion positions whose log-softmax (and entropy) is computed at once


def encode_prompts(tokenizer, questions: list[str], device, prompt=format_prompt) -> dict[str, torch.Tensor]:
    """Left-padded prompt batch: input_ids and attention_mask, both (B, P). ``prompt`` makes a question the
    prompt text (the run's: tokenization.prompt_formatter; default the plain template without BOS)."""
    enc = tokenizer([prompt(q) for q in questions], return_tensors="pt", padding=True, add_special_tokens=False)
    return {k: v.to(device) for k, v in enc.items()}


def token_logprobs(
    model, prompt_ids, prompt_attn, completions, mask, *, temperature: float = 1.0, entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(o_t | q, o_<t) of each completion token under the distribution it was sampled from, and the
    per-token entropy of that distribution (None without ``entropy``). Both (N, T). Each sequence runs whole;
    the training forwards run each prompt once per group instead (forwards.shared_prompt_logprobs).

    Outputs are drawn from softmax(logits / T) with T the sampling temperature, so the ratio to pi_old and
    the KL to pi_ref are taken between those distributions: log pi(o_t) = log_softmax(logits / T)[o_t].
    Example: logits [2, 0] at T = 2 -> log_softmax([1, 0]) = [-0.3133, -1.3133] (at T = 1: [-0.1269, -2.1269]).
    """
    ids = torch.cat([prompt_ids, completions], dim=1)  # (N, P+T)
    attn = torch.cat([prompt_attn, mask.long()], dim=1)  # (N, P+T)
    position_ids = (attn.cumsum(dim=1) - 1).clamp(min=0)  # left padding: positions start at each prompt
    T = completions.shape[1]
    # only the T + 1 last positions go through the output layer (those before the prompt's last predict nothing)
    logits = model(
        input_ids=ids, attention_mask=attn, position_ids=position_ids, use_cache=False, logits_to_keep=T + 1
    ).logits  # (N, T+1, V)
    return logits_to_logprobs(logits[:, :-1], completions, temperature, entropy)  # [:, :-1]: those predicting o_t


def logits_to_logprobs(
    logits: torch.Tensor, completions: torch.Tensor, temperature: float = 1.0, entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log_softmax(logits / temperature) at each completion token, and the entropy of each position's
    distribution (reported, not trained on: no grad; None without ``entropy``). (N, T, V) -> (N, T), (N, T).

    log pi(o_t) = z[o_t] - logsumexp(z) with z = logits / temperature, computed LOGPROB_CHUNK positions at a
    time (:class:`SelectedLogSoftmax`): no (N, T, V) tensor is made beside the logits, in the forward nor in
    the backward, which writes the logits' gradient (one more such tensor) chunk by chunk. With SmolLM2's
    49,152-token vocabulary, N 32 and T 160, one (N, T, V) fp32 tensor is 1 GB.
    Example: logits [2, 0], token 0, T = 2 -> z = [1, 0], log pi = 1 - log(e + 1) = -0.3133; entropy 0.5822.
    """
    logp, ent = SelectedLogSoftmax.apply(logits, completions, temperature, entropy)
    return logp, (ent if entropy else None)


class SelectedLogSoftmax(torch.autograd.Function):
    """(logits (N, T, V), tokens (N, T), temperature, entropy) -> (log pi (N, T), entropy (N, T), empty without
    ``entropy``); the gradient reaches the logits only: d log pi_t / d logits_t = (onehot(o_t) - softmax(z_t)) /
    temperature. It keeps the logits (the model's own output, no copy) and the (N, T) logsumexp, and works
    LOGPROB_CHUNK positions at a time; the entropy H = logsumexp(z) - sum_v softmax(z)_v z_v is read off the same
    chunk (no grad)."""

    @staticmethod
    def forward(ctx, logits, tokens, temperature, entropy):
        logp = torch.empty(tokens.shape, dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(logp)
        ent = torch.empty_like(logp) if entropy else logp.new_empty(0)
        for cols in _chunks(tokens.shape[1]):
            z = logits[:, cols].float() / temperature  # (N, c, V)
            lse[:, cols] = torch.logsumexp(z, dim=-1)
            logp[:, cols] = z.gather(-1, tokens[:, cols].unsqueeze(-1)).squeeze(-1) - lse[:, cols]
            if entropy:
                ent[:, cols] = lse[:, cols] - (torch.softmax(z, dim=-1) * z).sum(-1)
        ctx.save_for_backward(logits, tokens, lse)
        ctx.temperature = temperature
        ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, grad_logp, _grad_ent):
        logits, tokens, lse = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for cols in _chunks(tokens.shape[1]):
            z = logits[:, cols].float() / ctx.temperature
            part = torch.exp(z - lse[:, cols].unsqueeze(-1)).mul_(-grad_logp[:, cols].unsqueeze(-1))  # -g softmax
            part.scatter_add_(-1, tokens[:, cols].unsqueeze(-1), grad_logp[:, cols].unsqueeze(-1))  # + g onehot
            grad[:, cols] = part.div_(ctx.temperature)
        return grad, None, None, None


def _chunks(length: int) -> list[slice]:
    return [slice(i, min(i + LOGPROB_CHUNK, length)) for i in range(0, length, LOGPROB_CHUNK)]


def completion_texts(tokenizer, completions, mask, ended) -> list[str]:
    """Each completion's text: its tokens up to its end token (not included), special tokens left out."""
    content = (mask.sum(dim=1).long() - ended.long()).tolist()  # (N,) tokens before the end token
    return tokenizer.batch_decode(
        [row[:n] for row, n in zip(completions.tolist(), content, strict=True)], skip_special_tokens=True
    )


def token_texts(tokenizer, ids: set[int]) -> dict[int, str]:
    """The text of each token id decoded alone, as the group view shows end tokens (a handful of ids a step)."""
    ordered = sorted(ids)
    return dict(zip(ordered, tokenizer.batch_decode([[t] for t in ordered]), strict=True))


def output_tokens(tokenizer, completions, mask, ended) -> list[list[str]]:
    """Each output's tokens as the groups record them: each token's text in context (token_pieces: they spell the
    text), then the end token's text decoded alone where the output ended. completions (N, T), mask (N, T), ended
    (N,)."""
    lengths, ends = mask.sum(dim=1).long().tolist(), ended.tolist()
    ids = [completions[i, : lengths[i]].tolist() for i in range(len(lengths))]
    pieces = token_pieces(tokenizer, [row[: n - int(e)] for row, n, e in zip(ids, lengths, ends, strict=True)])
    end_text = token_texts(tokenizer, {row[-1] for row, e in zip(ids, ends, strict=True) if e})
    return [p + ([end_text[row[-1]]] if e else []) for p, row, e in zip(pieces, ids, ends, strict=True)]


@dataclass
class Judged:
    """N decoded outputs and the rules' verdicts on them, each list one entry per output."""

    texts: list[str]
    tokens: list[list[str]]  # each token's text in context (token_pieces: they spell the text), then the end token's
    outcome: list[tuple[float, dict[str, float]]]  # the verifier's (reward, components)
    # the verifier's reading: the final answer it read under the run's answer_match and the form that held it
    # (rewards.final_answer: gsm8k, boxed, number, none), whatever rewards the run pays
    readings: list[tuple[str | None, str]] = field(default_factory=list)
    steps: list[list[str]] = field(default_factory=list)  # process: the reasoning steps cut from the text
    step_ends: list[list[int]] = field(default_factory=list)  # process: 0-based token index of each step's end
    verdicts: list[list[float]] = field(default_factory=list)  # process: the step checker's, 1.0 / 0.0 per step


def judge(
    tokenizer,
    completions,
    mask,
    ended,
    examples: list[dict],
    *,
    process: bool,
    format_weight: float = 0.0,
    delimiter: str = STEP_DELIMITER,
    checker: str = "builtin",
    match: str = "strict",
) -> Judged:
    """Decode N sampled outputs and judge them with the rules; ``examples[i]`` is output i's question. The
    verifier reads each final answer once, as ``match`` says (RunSpec.answer_match: rewards.final_answer), and
    scores that reading (``readings``, rewards.reading_reward). With ``process``,
    each output is also cut into steps (the end token is no step) and each step checked by ``checker``
    (RunSpec.step_checker: :func:`step_verdicts`); 'rollouts' leaves the verdicts empty for the caller to sample
    (rollout_labels.rollout_verdicts)."""
    tokens = output_tokens(tokenizer, completions, mask, ended)
    pieces = [t[: len(t) - int(e)] for t, e in zip(tokens, ended.tolist(), strict=True)]  # the end token left out
    texts = ["".join(p) for p in pieces]
    out = Judged(texts, tokens, [])
    for i, ex in enumerate(examples):
        out.readings.append(final_answer(texts[i], match))
        out.outcome.append(reading_reward(out.readings[-1], ex["answer"], format_weight))
        if process:
            steps, ends = step_boundaries(pieces[i], delimiter)
            out.steps.append(steps)
            out.step_ends.append(ends)
            out.verdicts.append(
                []
                if checker == "rollouts"
                # sampled afterwards: label_by_rollouts
                else step_verdicts(steps, ex["question"], out.outcome[-1][1]["correct"] > 0, checker)
            )
    return out


def step_verdicts(steps: list[str], question: str, answer_right: bool, checker: str) -> list[float]:
    """1.0 or 0.0 for each step of one output. 'builtin': the built-in task's exact checker (each step the next
    operation, the last the answer line; it reads the strict '#### <answer>' form whatever the run's answer_match);
    'arithmetic': every equation in a step holds (step_check.step_equations_hold; a step with none counts as right)
    and the last step also needs the verifier's right final answer (``answer_right``, judged under the run's
    answer_match: with 'flexible' an output whose last number is right ends on a right step).

    >>> step_verdicts(["48/2 = 24 clips", "24 + 48 = 70", "#### 72"], "How many?", True, "arithmetic")
    [1.0, 0.0, 1.0]
    >>> step_verdicts(["3*4=12", "2+12=14", "#### 14"], "2+3*4", True, "builtin")
    [1.0, 1.0, 1.0]
    """
    if checker == "builtin":
        return [float(check_step(s, question, steps[:j])) for j, s in enumerate(steps)]
    last = len(steps) - 1
    return [float(step_equations_hold(s) and (j < last or answer_right)) for j, s in enumerate(steps)]


@dataclass
class RMExample:
    """One labelled output, as the reward model (grpo_engine.rm) reads and learns it. ORM: ``steps`` is [the whole output], ``labels`` [1.0 if it is correct].
    PRM: ``steps`` are the output's reasoning steps, ``labels`` one verdict per step."""

    question: str
    steps: list[str]
    labels: list[float]


def rm_examples(judged: Judged, examples: list[dict], kind: str, labelled: bool = True) -> list[RMExample]:
    """The reward model's view of judged outputs: ORM the whole output labelled by the verifier,
    PRM its steps labelled by the step checker (``labelled=False``: no labels, for scoring only)."""
    if kind == "orm":
        return [
            RMExample(ex["question"], [text], [comps["correct"]] if labelled else [])
            for ex, text, (_, comps) in zip(examples, judged.texts, judged.outcome, strict=True)
        ]
    return [
        RMExample(ex["question"], steps, verdicts if labelled else [])
        for ex, steps, verdicts in zip(examples, judged.steps, judged.verdicts, strict=True)
    ]
