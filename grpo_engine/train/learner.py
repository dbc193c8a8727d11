"""What a GRPO step reads: the ``Learner`` (what a run trains and samples with), a step's ``Sampled`` outputs,
and ``logprobs``, the log-prob pass of a model over a micro-batch of them that the reference, pi_old and the
update run. loading.load_learner builds the learner; step.py's grpo_step samples, scores and updates with it.

Shapes: N = B*G sequences, P prompt tokens, T completion tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from grpo_engine.rm.reward_model import RewardModel
from grpo_engine.rollout.forwards import MicroBatch, micro_batch_logprobs
from grpo_engine.rollout.rollout_labels import Completer
from grpo_engine.spec.config import RunSpec
from grpo_engine.train.parallel import Processes
from grpo_engine.train.sharding import gathered


@dataclass(kw_only=True)
class Learner:
    """What a run trains and samples with. ``policy`` and ``optimizer`` are Accelerate-prepared, or with sharding
    'fsdp' the sharded policy and its optimizer (a LoRA run replaces them at each new iteration, see
    loading.new_iteration); ``reference`` is None for LoRA (the base
    with the adapter off) and with kl_coef 0 (no KL term: no reference is kept); ``params`` are the trainable parameters; ``end_ids`` the tokens that end a
    completion; ``prompt`` makes a question the prompt text (the run's prompt_template); ``rm`` the learned
    reward model (reward: model); ``completer`` the model that continues outputs for rollout labels when it is
    not the policy (label_completer); ``source_dtype`` the dtype the model came in (model.source_dtype), which the
    trained policy downloads in."""

    spec: RunSpec
    accelerator: Any
    scoring_bf16: bool  # placement.Precision: the log-prob passes and the update under bf16 autocast
    procs: Processes
    policy: Any
    optimizer: torch.optim.Optimizer
    params: list
    reference: Any
    tokenizer: Any
    prompt: Callable[[str], str]
    end_ids: list[int]
    delimiter: str
    rm: RewardModel | None = None
    completer: Completer | None = None
    source_dtype: str = "float32"

    @property
    def dev(self) -> torch.device:
        return self.accelerator.device

    @property
    def sharded(self) -> bool:
        """Whether the policy is sharded across the run's processes (sharding 'fsdp')."""
        return self.spec.sharding == "fsdp"

    def unwrapped(self):
        """The policy itself, without a data-parallel wrapper."""
        return self.accelerator.unwrap_model(self.policy)

    def gathered(self):
        """The context of a phase whose forwards of the policy differ in number between processes (sampling,
        evaluation, the reward model's sampling): a sharded policy's parameters gathered once for it (every process
        enters it together); nothing for a policy that is not sharded (sharding.gathered)."""
        return gathered(self.unwrapped())

    def autocast(self):
        """The context of the log-prob passes and the update: bf16 autocast when ``scoring_bf16``. Sampling
        runs outside it (in bf16 only where Accelerate's mixed precision autocasts the policy, on a GPU)."""
        return torch.autocast(self.dev.type, dtype=torch.bfloat16, enabled=self.scoring_bf16)

    def ref_logprobs(self, mb: MicroBatch, s: Sampled) -> torch.Tensor:
        """log pi_ref of each completion token of the micro-batch ``mb`` of ``s``, (n, T)."""
        if self.reference is not None:
            with self.autocast():
                return logprobs(self.reference, mb, s, self.spec.temperature, entropy=False)[0]
        model = self.unwrapped()
        with model.disable_adapter(), self.autocast():
            return logprobs(model, mb, s, self.spec.temperature, entropy=False)[0]


@dataclass(kw_only=True)
class Sampled:
    """Step 1: the B questions and their N = B*G sampled outputs."""

    batch: list[dict]  # this process's questions
    prompt_ids: torch.Tensor  # (N, P), each prompt repeated G times, left-padded
    prompt_attn: torch.Tensor  # (N, P)
    completions: torch.Tensor  # (N, T)
    mask: torch.Tensor  # (N, T): 1.0 up to and including each output's end token
    ended: torch.Tensor  # (N,): False where an output was cut at max_new_tokens


def logprobs(model, mb: MicroBatch, s: Sampled, temperature: float, entropy: bool = True):
    """log pi and entropy (None without ``entropy``) of the completion tokens of micro-batch ``mb`` under ``model``,
    each prompt run once (forwards.micro_batch_logprobs), (n, T) each."""
    return micro_batch_logprobs(
        model,
        mb,
        prompt_ids=s.prompt_ids,
        prompt_attn=s.prompt_attn,
        completions=s.completions,
        mask=s.mask,
        temperature=temperature,
        entropy=entropy,
    )


@dataclass(kw_only=True)
class Scored:
    """Steps 2 and 3: what each output got."""

    texts: list[str]
    tokens: list[list[str]]  # each token's text, as the group view shows it
    components: list[dict[str, float]]  # the verifier's verdict ("correct", ...) and the RM's score
    rewards: torch.Tensor  # (N,): r_i (outcome), or the mean of the step rewards (process)
    group_rewards: list[list[float]]  # per question: the rewards its advantages were normalised over
    advantages: torch.Tensor  # (N, T), on the accelerator's device
    step_rewards: list[list[float] | None]  # process supervision: each output's step rewards
    step_ends: list[list[int] | None]  # process supervision: the token where each step ends
    labelling: float = 0.0  # seconds spent labelling steps by rollouts (step_labels 'rollouts')
    step_labels: list[list[float] | None] = field(default_factory=list)  # process: the rules' label of each step
    step_shares: list[list[float] | None] = field(
        default_factory=list
    )  # rollouts: each step's share reaching the answer
    readings: list[tuple[str | None, str]] = field(default_factory=list)  # the verifier's (answer, form) of each
