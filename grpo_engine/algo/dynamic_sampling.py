"""Dynamic sampling (DAPO, Yu et al. 2025, arXiv 2503.14476, section 3.2): each update trains on groups whose
rewards differ (run-spec keys skip_zero_spread, max_resample; off by default).

A group whose rewards are all equal (process supervision: all its step rewards) gets advantages exactly 0
(objective.outcome_advantages, process_advantages): its surrogate carries no gradient and only the KL term acts
on it, so as the policy gets more questions always right (or always wrong) fewer groups of each batch teach
anything. With ``skip_zero_spread`` a step drops such groups and samples groups for more questions instead:

    draw 0:  the step's own questions (this process's share n = B / devices)
    up to max_resample times, while some process has fewer than n informative groups:
        draw k:  m fresh questions on every process, m = the most groups missing on any process
    train on the first n informative groups (fewer when still short; a process that found none trains on its
    draw 0, whose advantages are all 0; when no process found any, the step makes no update)

Extra questions come from the trainer's random stream, m x devices at a time, each process keeping its share as
for the step's own B, so the stream stays the same on every process; questions are drawn from the whole
training set again, so one may come back within a step. Every process makes the same draws, so each calls the
collectives of scoring (the gathers of scale_rewards 'batch') equally often; one process alone draws exactly the
groups it misses. Each draw is scored on its own: with scale_rewards 'batch' a draw's advantages are divided by
the std of that draw's rewards, its dropped groups' included.

:func:`fill_informative` is that loop over plain data; :func:`informative_batch` runs it on sampled and scored
draws (learner.Sampled, learner.Scored) and joins the kept groups into one batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, TypeVar

import torch
import torch.nn.functional as F

T = TypeVar("T")
UPDATE_METRICS = ("loss", "kl", "clip_frac", "entropy", "grad_norm")  # a step without an update records none
LEFT_PADDED = ("prompt_ids", "prompt_attn")  # prompts are left-padded; every other (N, T) tensor right-padded
PAD_TOKEN = ("prompt_ids", "completions")  # padded with the pad token; masks and advantages with 0


def fill_informative(
    draw: Callable[[int], list[T]],
    need: int,
    max_resample: int,
    informative: Callable[[T], bool],
    agree: Callable[[int], int] = lambda missing: missing,
) -> tuple[list[T], int, int]:
    """Draw groups until ``need`` informative ones are kept or ``max_resample`` extra draws were made.

    draw(m): m fresh groups (the first call asks for ``need``); informative(g): whether g's rewards differ;
    agree(missing): how many groups every process draws next, given this process's missing count (one process:
    the count itself; several: the largest over them, a collective that every process calls after each draw,
    so they all stop after the same draw).
    Returns (kept, drawn, dropped): the first ``need`` informative groups in draw order, the groups drawn, and the
    zero-spread groups dropped (a process already full that draws for another one leaves its surplus unused).
    Example, need 4, each group's spread 0 or 1: draw 0 gives (1, 0, 0, 1): 2 kept, 2 dropped; draw 1 of 2 gives
    (0, 1): 3 kept; draw 2 of 1 gives (1): 4 kept. Returns 4 kept, drawn 7, dropped 3; max_resample 1 stops
    after draw 1 with 3 kept, drawn 6, dropped 3.
    """
    kept: list[T] = []
    drawn = dropped = 0
    count = need
    for _ in range(max_resample + 1):
        groups = draw(count)
        drawn += len(groups)
        for group in groups:
            if informative(group):
                kept.append(group)
            else:
                dropped += 1
        count = agree(max(0, need - len(kept)))
        if count == 0:
            break
    return kept[:need], drawn, dropped


def take(rows: T, groups: list[int], questions: int, G: int) -> T:
    """The groups ``groups`` (indices among ``questions``) of a dataclass of per-question and per-output values
    (learner.Sampled, learner.Scored): a list of ``questions`` entries by question, a list or tensor of questions x G
    by output (a group's G outputs are consecutive), a number (seconds) as it is.

    Example, 3 questions, G 2: groups [2, 0] of per-output [a, b, c, d, e, f] -> [e, f, a, b]."""
    outputs = [b * G + g for b in groups for g in range(G)]
    values = {}
    for f in fields(rows):
        value = getattr(rows, f.name)
        if isinstance(value, torch.Tensor):
            value = value[torch.tensor(outputs, dtype=torch.long, device=value.device)]
        elif isinstance(value, list) and len(value) in (questions, questions * G):
            value = [value[i] for i in (groups if len(value) == questions else outputs)]
        elif not isinstance(value, (int, float)):
            raise TypeError(f"dynamic sampling cannot select the groups of {type(rows).__name__}.{f.name}")
        values[f.name] = value
    return type(rows)(**values)


def join(parts: list[T], pad_id: int) -> T:
    """One dataclass of several of the same type: lists and tensors concatenated (an (N, T) tensor padded to the
    widest part, prompts on the left, the rest on the right), numbers (seconds) added up."""
    values: dict[str, Any] = {}
    for f in fields(parts[0]):
        vs = [getattr(p, f.name) for p in parts]
        if isinstance(vs[0], torch.Tensor):
            values[f.name] = cat_padded(vs, f.name in LEFT_PADDED, pad_id if f.name in PAD_TOKEN else 0)
        elif isinstance(vs[0], list):
            values[f.name] = [x for v in vs for x in v]
        else:
            values[f.name] = sum(vs)
    return type(parts[0])(**values)


def cat_padded(tensors: list[torch.Tensor], left: bool, value: float) -> torch.Tensor:
    """Concatenate along dim 0; 2-D tensors are first padded with ``value`` to the widest (on the left when
    ``left``). Example: [[1, 2]] and [[3]] right-padded with 0 -> [[1, 2], [3, 0]]."""
    if tensors[0].dim() == 2:
        width = max(t.shape[1] for t in tensors)
        tensors = [F.pad(t, (width - t.shape[1], 0) if left else (0, width - t.shape[1]), value=value) for t in tensors]
    return torch.cat(tensors)


@dataclass(kw_only=True)
class Filled:
    """What :func:`informative_batch` gives the step."""

    sampled: Any  # learner.Sampled: the kept groups' questions and outputs
    scored: Any  # learner.Scored: their rewards and advantages
    drawn: float  # groups sampled this step, over every process (metric sampling/drawn)
    dropped: float  # zero-spread groups dropped, over every process (metric sampling/dropped)
    trains: bool  # whether some process kept an informative group: else the step makes no update
    sampling: float  # seconds every draw spent sampling


def informative_batch(
    first: tuple, draw_scored: Callable[[int], tuple], need: int, *, max_resample: int, G: int, procs, pad_id: int
) -> Filled:
    """Dynamic sampling on this process. ``first``: (Sampled, Scored, seconds spent sampling) of the step's own
    questions; draw_scored(m): the same for m fresh questions; ``need``: this process's share of B; ``procs``:
    parallel.Processes (agreeing on every draw's size, summing the counts). A group is informative when the
    rewards its advantages were normalised over (Scored.group_rewards) differ. The kept groups' Scored counts the
    labelling seconds of every draw."""
    parts = []

    def draw(m: int) -> list[tuple[int, int]]:
        parts.append(first if not parts else draw_scored(m))
        return [(len(parts) - 1, b) for b in range(len(parts[-1][0].batch))]

    def informative(group: tuple[int, int]) -> bool:
        part, b = group
        return len(set(parts[part][1].group_rewards[b])) > 1

    kept, drawn, dropped = fill_informative(
        draw, need, max_resample, informative, lambda missing: max(procs.gather([missing]))
    )
    totals = procs.sum([float(drawn), float(dropped), float(len(kept))])
    if not kept:  # none here: the step's own groups, whose advantages are all 0
        kept = [(0, b) for b in range(len(first[0].batch))]
    by_part: dict[int, list[int]] = {}
    for part, b in kept:
        by_part.setdefault(part, []).append(b)
    sampled = join([take(parts[p][0], bs, len(parts[p][0].batch), G) for p, bs in by_part.items()], pad_id)
    scored = join([take(parts[p][1], bs, len(parts[p][0].batch), G) for p, bs in by_part.items()], pad_id)
    scored.labelling = sum(p[1].labelling for p in parts)
    return Filled(
        sampled=sampled,
        scored=scored,
        drawn=totals[0],
        dropped=totals[1],
        trains=totals[2] > 0,
        sampling=sum(p[2] for p in parts),
    )


def no_update(mu: int) -> dict:
    """step.update's sums for a step that makes no update (no process found a group whose rewards differ): zeros,
    no token counted."""
    return {"per_update": [0.0] * 3 * mu, "entropy": 0.0, "grad_norm": 0.0, "tokens": 0.0}
