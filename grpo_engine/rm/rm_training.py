"""The learned reward model's training inside a run: its state (examples so far, random stream, rm_data),
fresh policy samples labelled without humans, and the (re)training with a replay of older data (Algorithm 1's
refresh)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from grpo_engine.model.model import no_progress
from grpo_engine.report.recorder import no_check
from grpo_engine.rm.reward_model import (
    FIT_BATCH,
    FIT_EPOCHS,
    RewardModel,
    RMExample,
    replay_mix,
)
from grpo_engine.rm.reward_model import (
    accuracy as rm_accuracy,
)
from grpo_engine.rm.reward_model import (
    fit as rm_fit,
)
from grpo_engine.rollout.outputs import encode_prompts, judge, rm_examples
from grpo_engine.rollout.rollout_labels import Completer, Continuing, StepOutputs, rollout_verdicts
from grpo_engine.rollout.sampling import generate
from grpo_engine.rollout.tokenization import completion_mask, end_token_ids
from grpo_engine.spec.config import RunSpec
from grpo_engine.spec.words import decode_delimiter


@dataclass
class RewardModelState:
    """A learned reward model's training: its examples so far (replayed at each refresh), its random stream,
    and Math-Shepherd data when ``rm_data`` is given (pool, held out: the first training's examples)."""

    name: str
    history: list[RMExample] = field(default_factory=list)
    rng: random.Random | None = None
    data: tuple[list[RMExample], list[RMExample]] | None = None


@dataclass(frozen=True)
class Sampler:
    """The policy a reward model's examples are sampled from: the model, its tokenizer, its prompt formatter
    (tokenization.prompt_formatter), its device, and the ``completer`` that continues steps for rollout labels
    (None: the policy itself)."""

    policy: object
    tokenizer: object
    prompt: Callable[[str], str]
    device: object
    completer: Completer | None = None


@torch.no_grad()
def sample_labelled(
    sampler: Sampler, questions: list[dict], spec: RunSpec, kind: str, check: Callable[[], None] = no_check
) -> list[RMExample]:
    """One output per question from the current policy (sampled as in training), labelled without humans:
    by the verifier under the run's answer_match (ORM) or the run's step labels (PRM: RunSpec.step_checker;
    'rollouts' continues each step with the same policy, or with the sampler's completer). Generates B x G outputs
    at a time, calling ``check`` before each batch (it raises to stop)."""
    policy, tokenizer, device = sampler.policy, sampler.tokenizer, sampler.device
    policy.eval()
    out = []
    for i in range(0, len(questions), spec.batch_size * spec.group_size):
        check()
        chunk = questions[i : i + spec.batch_size * spec.group_size]
        prompts = encode_prompts(tokenizer, [e["question"] for e in chunk], device, sampler.prompt)
        completions = generate(
            policy,
            tokenizer,
            prompts,
            repeat=1,
            greedy=False,
            max_new_tokens=spec.max_new_tokens,
            temperature=spec.temperature,
            top_p=spec.top_p,
        )
        end_ids = end_token_ids(policy, tokenizer)
        mask, ended = completion_mask(completions, end_ids)
        judged = judge(
            tokenizer,
            completions,
            mask,
            ended,
            chunk,
            process=kind == "prm",
            delimiter=decode_delimiter(spec.step_delimiter),
            checker=spec.step_checker,
            match=spec.answer_match,
        )
        if kind == "prm" and spec.step_checker == "rollouts":
            outputs = StepOutputs.judged(prompts["input_ids"], prompts["attention_mask"], completions, judged, chunk)
            how = Continuing.for_run(spec, end_ids)
            judged.verdicts = rollout_verdicts(
                policy, tokenizer, outputs, how, spec.label_estimate, completer=sampler.completer
            )
        out += rm_examples(judged, chunk, kind)
    return out


class BatchCounter:
    """The ``check`` of the reward model's work that also counts its batches: called before each batch (of
    sampling or of training), it calls ``check`` and then ``progress(batches done, total)``. ``total`` is
    set when the work's size is known (see ``train_reward_model``)."""

    def __init__(self, check: Callable[[], None], progress: Callable[[int, int], None], total: int):
        self.check, self.progress, self.total, self.done = check, progress, total, 0

    def __call__(self) -> None:
        """One more batch starts: stop if asked to, then report the batches already done."""
        self.check()
        self.progress(self.done, self.total)
        self.done += 1

    def finish(self) -> None:
        """Every batch is done."""
        self.done = self.total
        self.progress(self.done, self.total)


def sampling_batches(n_questions: int, spec: RunSpec) -> int:
    """How many batches ``sample_labelled`` generates for ``n_questions`` (B x G outputs each)."""
    return math.ceil(n_questions / (spec.batch_size * spec.group_size))


def fit_batches(n_examples: int) -> int:
    """How many training batches the reward model's ``fit`` runs on ``n_examples``."""
    return FIT_EPOCHS * math.ceil(n_examples / FIT_BATCH)


def train_reward_model(
    rm: RewardModel,
    state: RewardModelState,
    sampler: Sampler,
    *,
    train_set: list[dict],
    heldout: list[dict],
    spec: RunSpec,
    check: Callable[[], None] = no_check,
    progress: Callable[[int, int], None] = no_progress,
) -> dict[str, float]:
    """Train the RM on fresh labelled samples of the ``sampler``'s policy mixed with a replay of the ``state``'s
    history (its examples so far), drawing from its random stream.

    The first call (empty history) is the RM's initial training on the initial policy's outputs; later
    calls are Algorithm 1's refresh, and also measure the RM's accuracy on held-out fresh policy
    samples before it. Questions are drawn at random (with replacement); the samples are labelled by the
    verifier (ORM) or the run's step labels (PRM: sample_labelled). Appends the fresh samples to the history;
    returns the rm/* metrics.

    The state's ``data`` (rm_data: Math-Shepherd-labelled solutions, as (pool, held out)) is a warm start: the first
    training's fresh examples are the first rm_samples of the pool, and its accuracy is measured on the held-out
    ones. Every refresh trains on the current policy's samples, as Algorithm 1 says (with rm_data in the replay).

    ``check`` is called before every batch of sampling and of training: it raises (StopRequested) to stop the
    work half-way, leaving ``history`` as it was. ``progress(done, total)`` follows those batches (sampling
    and labelling first, then training), before each and once all are done.
    """
    history, rng, data = state.history, state.rng, state.data
    warm_start = data is not None and not history
    n_fresh = min(spec.rm_samples, len(data[0])) if warm_start else spec.rm_samples
    n_replay = min(len(history), round(spec.rm_replay_ratio * n_fresh))  # as replay_mix draws them
    n_held = max(1, spec.rm_samples // 4)
    n_sampling = 0 if warm_start else sampling_batches(n_held, spec) + sampling_batches(n_fresh, spec)
    counter = BatchCounter(check, progress, n_sampling + fit_batches(n_fresh + n_replay))
    if warm_start:
        pool, held = data
        fresh = pool[: spec.rm_samples]
    else:
        held = sample_labelled(sampler, rng.choices(heldout, k=n_held), spec, rm.kind, counter)
        fresh = sample_labelled(sampler, rng.choices(train_set, k=spec.rm_samples), spec, rm.kind, counter)
    metrics = {"rm/accuracy_before": rm_accuracy(rm, held)} if history else {}  # before this (re)training
    mixed, n_replayed = replay_mix(fresh, history, spec.rm_replay_ratio, rng)
    counter.total = counter.done + fit_batches(len(mixed))  # the exact count, from the set replay_mix built
    metrics["rm/loss"] = rm_fit(rm, mixed, spec.rm_learning_rate, rng, check=counter)
    counter.finish()
    metrics["rm/accuracy_after"] = rm_accuracy(rm, held)
    metrics["rm/train_examples"] = float(len(mixed))
    metrics["rm/replayed"] = float(n_replayed)
    history.extend(fresh)
    return metrics
