"""The training forwards: log-probabilities of the sampled completions with each prompt run once per group.

The G outputs of a group continue one prompt. The flat way (``outputs.token_logprobs``) runs every sequence
``prompt + completion`` whole, so the prompt goes through the model G times in the reference pass, the pi_old
pass and the policy's forward and backward. Here a micro-batch runs in two passes:

1. **prompts**: its U distinct prompts (U <= n), once each, keeping their keys and values (the KV cache) and the
   logits of each prompt's last position, which predict every completion's first token;
2. **completions**: the cache is indexed to one row per completion (``prompt_of``), and the n completions
   (their last token dropped: it predicts nothing) attend to it, positions continuing from each prompt's end.

Both passes run under autograd: indexing the cache sums the G completions' gradients into the prompt's
positions, so the log-probs and the gradient are those of the flat pass (tests/engine/rollout/test_shared_prompts.py: within
1e-5 in fp32), for (U x P) + (n x T) tokens instead of n x (P + T).

A micro-batch also carries less padding: its completions are cut to its longest real completion and its
prompts to its longest real prompt before the forward (columns that are padding in every row change nothing:
masked keys, causal queries). :func:`plan_micro_batches` cuts the N sequences into micro-batches either in
sampling order (groups whole, each prompt run once) or sorted by completion length (less padding; a group's
prompt runs once in each micro-batch it lands in), whichever processes fewer tokens.

Shapes: N sequences of the step, n of a micro-batch, U its distinct prompts, P prompt tokens, T completion
tokens, V the vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from grpo_engine.rollout.outputs import logits_to_logprobs, token_logprobs
from grpo_engine.rollout.sampling import CACHE


@dataclass
class MicroBatch:
    """One forward's share of the step's N sequences, and how its prompts are shared."""

    rows: torch.Tensor  # (n,) the sequences it holds (indices into the step's N)
    prompt_rows: torch.Tensor  # (U,) one sequence per distinct prompt: whose prompt to run
    prompt_of: torch.Tensor  # (n,) for each sequence, its prompt's index in prompt_rows
    prompt_start: int  # first prompt column that holds a real token in some row (left padding before it)
    length: int  # completion columns kept: the longest real completion of its rows

    def tokens(self, prompt_len: int) -> int:
        """Tokens one forward of it processes, with ``prompt_len`` prompt columns in all: U x P' + n x T'."""
        return len(self.prompt_rows) * (prompt_len - self.prompt_start) + len(self.rows) * self.length


def micro_batch(rows: torch.Tensor, lengths: torch.Tensor, prompt_attn: torch.Tensor, group_size: int) -> MicroBatch:
    """The micro-batch of ``rows``: sequence i continues prompt i // G (a group's G outputs are consecutive
    rows, each with the group's prompt). ``lengths`` (N,): real completion tokens; ``prompt_attn`` (N, P).

    Example, G = 4, rows [5, 2, 3, 4] of lengths 3, 7, 2, 6: the prompts of groups 0 and 1, prompt_rows [0, 4],
    prompt_of [1, 0, 0, 1], length 7.
    """
    groups, prompt_of = torch.unique(rows // group_size, return_inverse=True)
    prompt_rows = groups * group_size
    real = prompt_attn[prompt_rows].sum(dim=0) > 0  # (P,) columns real in some prompt
    start = int(real.nonzero()[0]) if bool(real.any()) else prompt_attn.shape[1] - 1
    return MicroBatch(rows, prompt_rows, prompt_of.reshape(-1), start, int(lengths[rows].max()))


def plan_micro_batches(mask: torch.Tensor, prompt_attn: torch.Tensor, group_size: int, size: int) -> list[MicroBatch]:
    """The micro-batches of the step's N sequences (``mask`` (N, T) their completion tokens, ``prompt_attn``
    (N, P)), at most ``size`` sequences each (0: all in one). Two orders are planned, sampling order and
    sorted by completion length (longest first); the one whose forwards process fewer tokens is used.

    Example, G 2, size 2, lengths [8, 1, 8, 1], prompts of 10 tokens: in sampling order each micro-batch is
    one group, 10 + 2 x 8 = 26 tokens each (52); sorted, [0, 2] holds two prompts and 2 x 8 (36) and [1, 3]
    two prompts and 2 x 1 (22): 58, so sampling order is kept. With prompts of 1 token: 34 in sampling order,
    22 sorted.
    """
    n = mask.shape[0]
    size = size or n
    cpu_mask, cpu_attn = mask.detach().cpu(), prompt_attn.detach().cpu()
    lengths = cpu_mask.sum(dim=1).long()
    orders = [torch.arange(n)]
    if size < n:
        orders.append(torch.sort(lengths, descending=True, stable=True).indices)
    plans = [
        [micro_batch(order[i : i + size], lengths, cpu_attn, group_size) for i in range(0, n, size)] for order in orders
    ]
    return min(plans, key=lambda plan: sum(mb.tokens(prompt_attn.shape[1]) for mb in plan))


def shared_prompt_logprobs(
    model,
    prompt_ids,
    prompt_attn,
    prompt_of,
    *,
    completions,
    mask,
    temperature: float = 1.0,
    entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(o_t | q, o_<t) and the entropy of each completion token, each prompt run once: ``prompt_ids``,
    ``prompt_attn`` (U, P) the distinct prompts, left-padded; ``prompt_of`` (n,) the prompt each of the n
    ``completions`` (n, T) continues; ``mask`` (n, T) their real tokens. Returns (n, T), (n, T) (None without
    ``entropy``), equal to ``outputs.token_logprobs`` on the prompts repeated row by row.

    Positions count from each prompt's first real token, as in sampling: prompt real length L, completion
    token t at position L + t. The prompt pass's last logits predict o_0; the completion pass over
    o_0 .. o_{T-2} predicts o_1 .. o_{T-1}. Every call makes exactly these two forwards, whatever the lengths:
    a data-parallel wrapper synchronises buffers in some forwards, so every process must make as many.
    """
    T = completions.shape[1]
    if T == 1:  # one padding column, so that the completion pass runs (see below) and is dropped after
        logp, ent = shared_prompt_logprobs(
            model,
            prompt_ids,
            prompt_attn,
            prompt_of,
            completions=F.pad(completions, (0, 1)),
            mask=F.pad(mask, (0, 1)),
            temperature=temperature,
            entropy=entropy,
        )
        return logp[:, :1], None if ent is None else ent[:, :1]
    positions = (prompt_attn.cumsum(dim=1) - 1).clamp(min=0)  # (U, P)
    out = model(
        input_ids=prompt_ids, attention_mask=prompt_attn, position_ids=positions, use_cache=True, logits_to_keep=1
    )
    cache = getattr(out, CACHE)
    cache.batch_select_indices(prompt_of)  # (U, ...) -> (n, ...); the gradient sums back over the group
    attn = torch.cat([prompt_attn[prompt_of], mask[:, :-1].long()], dim=1)  # (n, P + T - 1)
    steps = (attn.cumsum(dim=1) - 1).clamp(min=0)[:, prompt_ids.shape[1] :]  # (n, T - 1)
    rest = model(
        input_ids=completions[:, :-1], attention_mask=attn, position_ids=steps, use_cache=True, **{CACHE: cache}
    ).logits  # (n, T - 1, V): predict o_1 .. o_{T-1}
    first = logits_to_logprobs(out.logits[:, -1:][prompt_of], completions[:, :1], temperature, entropy)  # o_0
    later = logits_to_logprobs(rest, completions[:, 1:], temperature, entropy)  # o_1 .. o_{T-1}
    return (
        torch.cat([first[0], later[0]], dim=1),
        None if first[1] is None else torch.cat([first[1], later[1]], dim=1),
    )


def micro_batch_logprobs(
    model,
    mb: MicroBatch,
    *,
    prompt_ids,
    prompt_attn,
    completions,
    mask,
    temperature: float = 1.0,
    entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`shared_prompt_logprobs` of one micro-batch of the step's tensors (``prompt_ids``, ``prompt_attn``
    (N, P), ``completions``, ``mask`` (N, T)), its padding cut; returns (n, T) padded back with zeros (the
    columns past its longest completion are padding in every row: the loss mask leaves them out)."""
    rows, cols, start = mb.rows.to(completions.device), slice(0, mb.length), mb.prompt_start
    if model.training and recomputes_activations(model):  # it keeps no KV cache while training: run it flat
        logp, ent = token_logprobs(
            model,
            prompt_ids[rows, start:],
            prompt_attn[rows, start:],
            completions[rows, cols],
            mask[rows, cols],
            temperature=temperature,
            entropy=entropy,
        )
    else:
        prompts = mb.prompt_rows.to(prompt_ids.device)
        logp, ent = shared_prompt_logprobs(
            model,
            prompt_ids[prompts, start:],
            prompt_attn[prompts, start:],
            mb.prompt_of.to(rows.device),
            completions=completions[rows, cols],
            mask=mask[rows, cols],
            temperature=temperature,
            entropy=entropy,
        )
    pad = (0, completions.shape[1] - mb.length)
    return F.pad(logp, pad), None if ent is None else F.pad(ent, pad)


def recomputes_activations(model) -> bool:
    """Whether ``model`` (or the model inside a LoRA or data-parallel wrapper) has gradient checkpointing on:
    transformers then turns the KV cache off while training, so the prompts cannot be shared."""
    return any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())


def in_step_order(parts: list[torch.Tensor], plan: list[MicroBatch]) -> torch.Tensor:
    """The micro-batches' (n, ...) results put back into the step's sequence order: (N, ...)."""
    rows = torch.cat([mb.rows for mb in plan]).to(parts[0].device)
    out = parts[0].new_empty((len(rows), *parts[0].shape[1:]))
    out[rows] = torch.cat(parts)
    return out
