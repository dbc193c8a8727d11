"""The learned reward model's training inside a run: its state (examples so far, random stream, rm_data),
fresh policy samples labelled without humans, and the (re)training with a replay of older data (Algorithm 1's
refresh)."""
from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .config import RunSpec, decode_delimiter
from .reward_model import RewardModel, RMExample, accuracy as rm_accuracy, fit as rm_fit, replay_mix
from .recorder import no_check
from .sampling import generate
from .step import encode_prompts, judge, rm_examples
from .tokenization import completion_mask, end_token_ids


@dataclass
class RewardModelState:
    """A learned reward model's training: its examples so far (replayed at each refresh), its random stream,
    and Math-Shepherd data when ``rm_data`` is given (pool, held out)."""

    name: str
    history: list[RMExample] = field(default_factory=list)
    rng: random.Random | None = None
    data: tuple[list[RMExample], list[RMExample]] | None = None


@torch.no_grad()
def sample_labelled(policy, tokenizer, prompt, questions: list[dict], spec: RunSpec, kind: str,
                    device, check: Callable[[], None] = no_check) -> list[RMExample]:
    """One output per question from the current policy (sampled as in training), labelled without humans:
    by the verifier (ORM) or the step checker (PRM). Generates B x G outputs at a time, calling ``check``
    before each batch (it raises to stop)."""
    policy.eval()
    out = []
    for i in range(0, len(questions), spec.batch_size * spec.group_size):
        check()
        chunk = questions[i : i + spec.batch_size * spec.group_size]
        prompts = encode_prompts(tokenizer, [e["question"] for e in chunk], device, prompt)
        completions = generate(policy, tokenizer, prompts, repeat=1, greedy=False, max_new_tokens=spec.max_new_tokens,
                               temperature=spec.temperature, top_p=spec.top_p)
        mask, ended = completion_mask(completions, end_token_ids(policy, tokenizer))
        out += rm_examples(judge(tokenizer, completions, mask, ended, chunk, kind == "prm",
                                 delimiter=decode_delimiter(spec.step_delimiter)), chunk, kind)
    return out


def train_reward_model(rm: RewardModel, history: list[RMExample], policy, tokenizer, prompt, train_set: list[dict],
                       heldout: list[dict], spec: RunSpec, rng: random.Random, device,
                       data: tuple[list[RMExample], list[RMExample]] | None = None,
                       check: Callable[[], None] = no_check) -> dict[str, float]:
    """Train the RM on fresh labelled samples of the current policy mixed with a replay of ``history``.

    The first call (empty history) is the RM's initial training on the initial policy's outputs; later
    calls are Algorithm 1's refresh, and also measure the RM's accuracy on held-out fresh policy
    samples before it. Questions are drawn at random (with replacement). Appends the fresh samples to
    ``history``; returns the rm/* metrics.

    ``data`` (rm_data: Math-Shepherd-labelled solutions, as (pool, held out)): the fresh examples are the
    next rm_samples of the pool not used before (from the start again once all were used), and accuracy
    is measured on the held-out ones, instead of sampling and labelling the policy's outputs.

    ``check`` is called before every batch of sampling and of training: it raises (StopRequested) to stop the
    work half-way, leaving ``history`` as it was.
    """
    if data is not None:
        pool, held = data
        start = len(history) % len(pool)  # every example drawn so far is in the history
        fresh = (pool[start:] + pool[:start])[: spec.rm_samples]
    else:
        held = sample_labelled(policy, tokenizer, prompt, rng.choices(heldout, k=max(1, spec.rm_samples // 4)), spec,
                               rm.kind, device, check)
        fresh = sample_labelled(policy, tokenizer, prompt, rng.choices(train_set, k=spec.rm_samples), spec, rm.kind,
                                device, check)
    metrics = {"rm/accuracy_before": rm_accuracy(rm, held)} if history else {}  # before this (re)training
    mixed, n_replayed = replay_mix(fresh, history, spec.rm_replay_ratio, rng)
    metrics["rm/loss"] = rm_fit(rm, mixed, spec.rm_learning_rate, rng, check=check)
    metrics["rm/accuracy_after"] = rm_accuracy(rm, held)
    metrics["rm/train_examples"] = float(len(mixed))
    metrics["rm/replayed"] = float(n_replayed)
    history.extend(fresh)
    return metrics
