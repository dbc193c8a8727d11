"""One GRPO step: the body of Algorithm 1's inner loop, read top to bottom.

    1. sample G outputs for each of this process's B questions from pi_old (the current policy, no grad)
    2. score every output: the rules judge it (and give the true verdict "correct"); with reward: model the
       ORM's score is r_i, or the PRM's scores are the step rewards
    3. advantages: outcome (4.1.2) or process (4.1.3) supervision; the reference's and pi_old's log-probs
    4. mu policy updates maximising J_GRPO (Eq. 3) with the k3 KL penalty (Eq. 4)
    5. the step's metrics and groups; with several processes, metrics over the whole batch

``Learner`` holds what the step trains and samples with; train() (trainer.py) runs the steps, evaluates,
refreshes the reward model, records and checkpoints.

Shapes: B questions (in one process: its B / devices), G outputs each, N = B*G sequences, P prompt tokens,
T completion tokens.
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from grpo_engine.rollout.rollout_labels import Completer, labels_from_shares, rollout_shares
from grpo_engine.spec.config import RunSpec
from grpo_engine.algo.dynamic_sampling import UPDATE_METRICS, Filled, informative_batch, no_update
from grpo_engine.algo.objective import grpo_loss, loss_denominator, outcome_advantages, process_advantages
from grpo_engine.algo.overlong import loss_mask, penalise_overlong
from grpo_engine.train.parallel import Processes
from grpo_engine.report.recorder import GroupRecord, SampleRecord
from grpo_engine.rewards.reward_functions import REPETITION_MAX_PENALTY, named_rewards, repetition_reward, reward_means
from grpo_engine.rm.reward_model import RewardModel
from grpo_engine.rewards.rewards import extract_final_answer
from grpo_engine.rollout.sampling import generate
from grpo_engine.rollout.tokenization import completion_mask
from grpo_engine.rollout.forwards import MicroBatch, in_step_order, micro_batch_logprobs, plan_micro_batches
from grpo_engine.rollout.outputs import Judged, encode_prompts, judge, rm_examples


@dataclass
class Learner:
    """What a run trains and samples with. ``policy`` and ``optimizer`` are Accelerate-prepared (a LoRA run
    replaces them at each new iteration, see trainer.new_iteration); ``reference`` is None for LoRA (the base
    with the adapter off) and with kl_coef 0 (no KL term: no reference is kept); ``params`` are the trainable parameters; ``end_ids`` the tokens that end a
    completion; ``prompt`` makes a question the prompt text (the run's prompt_template); ``rm`` the learned
    reward model (reward: model); ``completer`` the model that continues outputs for rollout labels when it is
    not the policy (label_completer)."""

    spec: RunSpec
    accelerator: Any
    scoring_bf16: bool  # loading.Precision: the log-prob passes and the update under bf16 autocast
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

    @property
    def dev(self) -> torch.device:
        return self.accelerator.device

    def unwrapped(self):
        """The policy itself, without a data-parallel wrapper."""
        return self.accelerator.unwrap_model(self.policy)

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


@dataclass
class Sampled:
    """Step 1: the B questions and their N = B*G sampled outputs."""

    batch: list[dict]  # this process's questions
    prompt_ids: torch.Tensor  # (N, P), each prompt repeated G times, left-padded
    prompt_attn: torch.Tensor  # (N, P)
    completions: torch.Tensor  # (N, T)
    mask: torch.Tensor  # (N, T): 1.0 up to and including each output's end token
    ended: torch.Tensor  # (N,): False where an output was cut at max_new_tokens


@dataclass
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


@dataclass
class StepResult:
    """What a step reports: its metrics, and this process's groups (empty when the step is not recorded)."""

    metrics: dict[str, float]
    groups: list[GroupRecord]


def grpo_step(
    learner: Learner, batch: list[dict], record: bool, more: Callable[[int], list[dict]] | None = None
) -> StepResult:
    """Steps 1-5 on this process's ``batch`` of questions. Every process calls it at every step (it gathers).
    With skip_zero_spread, groups whose rewards are all equal give way to groups for fresh questions, ``more(m)``
    giving m of them (dynamic_sampling.informative_batch); when no process has a group left, no update is made.
    When every advantage of the batch is 0 (every group zero-spread), the update's passes run and its metrics are
    recorded, but the optimizer does not step: the policy stays exactly as it was (metric update/skipped)."""
    spec, t0 = learner.spec, time.time()
    sampled, scored, sampling = sample_scored(learner, batch)
    filled = Filled(sampled, scored, float(spec.batch_size), 0.0, True, sampling)
    if spec.skip_zero_spread:
        filled = informative_batch(
            (sampled, scored, sampling),
            lambda m: sample_scored(learner, more(m)),
            len(batch),
            spec.max_resample,
            spec.group_size,
            learner.procs,
            learner.tokenizer.pad_token_id,
        )
    sampled, scored = filled.sampled, filled.scored
    steps = filled.trains and carries_signal(learner, scored.advantages)  # whether the optimizer steps
    chunks = plan_micro_batches(sampled.mask, sampled.prompt_attn, spec.group_size, spec.micro_batch_size)
    ref_logp, old_logp = reference_and_old_logprobs(learner, sampled, chunks) if filled.trains else (None, None)
    t2 = time.time()
    sums = (
        update(learner, sampled, scored.advantages, ref_logp, old_logp, chunks, detail=record, steps=steps)
        if filled.trains
        else no_update(spec.policy_updates_per_batch)
    )
    t3 = time.time()
    metrics = step_metrics(learner, sampled, scored, sums)
    if not filled.trains:  # no update: none of its metrics
        metrics = {k: v for k, v in metrics.items() if k not in UPDATE_METRICS}
    metrics.update(
        {
            "time/sampling": filled.sampling,
            "time/scoring": t2 - t0 - filled.sampling - scored.labelling,
            "time/labelling": scored.labelling,
            "time/update": t3 - t2,
            "sampling/drawn": filled.drawn,
            "sampling/dropped": filled.dropped,
            "update/skipped": float(not steps),
        }
    )
    if learner.spec.rewards:  # reward/<name>: each named reward's mean over the whole batch
        metrics.update(reward_means(learner.procs.gather(scored.components), learner.spec.rewards))
    groups = (
        group_records(sampled, scored, learner.spec.group_size, learner.prompt, sums.get("detail")) if record else []
    )
    return StepResult(metrics, groups)


def carries_signal(learner: Learner, advantages: torch.Tensor) -> bool:
    """Whether some advantage of the whole batch (every process's) is not 0. A batch whose advantages are all 0
    has no policy gradient; an optimizer step on it would still move the policy (AdamW divides the KL term's tiny
    gradient by its own running scale), so on such a batch the optimizer does not step."""
    return learner.procs.sum([float(bool((advantages != 0).any()))])[0] > 0


def sample_scored(learner: Learner, batch: list[dict]) -> tuple[Sampled, Scored, float]:
    """Steps 1 and 2 on ``batch``: its outputs, their rewards and advantages, and the seconds sampling took."""
    t = time.time()
    sampled = sample(learner, batch)
    t = time.time() - t
    return sampled, score(learner, sampled), t


@torch.no_grad()
def sample(learner: Learner, batch: list[dict]) -> Sampled:
    """1. G outputs for each question of ``batch`` from pi_old (the current policy, no grad)."""
    spec, G = learner.spec, learner.spec.group_size
    prompts = encode_prompts(learner.tokenizer, [e["question"] for e in batch], learner.dev, learner.prompt)
    learner.policy.eval()
    completions = generate(
        learner.unwrapped(),
        learner.tokenizer,
        prompts,
        repeat=G,
        greedy=False,
        max_new_tokens=spec.max_new_tokens,
        temperature=spec.temperature,
        top_p=spec.top_p,
        end_ids=learner.end_ids,
        decode=spec.decode,
    )  # (N, T)
    mask, ended = completion_mask(completions, learner.end_ids)  # (N, T), (N,)
    return Sampled(
        batch,
        prompts["input_ids"].repeat_interleave(G, dim=0),
        prompts["attention_mask"].repeat_interleave(G, dim=0),
        completions,
        mask,
        ended,
    )


def score(learner: Learner, sampled: Sampled) -> Scored:
    """2. rewards (the rules, or the learned ORM / PRM) and 3. the advantages of every token, (N, T)."""
    spec, rm, G = learner.spec, learner.rm, learner.spec.group_size
    N, T = sampled.completions.shape
    B = N // G
    rows = [sampled.batch[i // G] for i in range(N)]
    judged = judge(
        learner.tokenizer,
        sampled.completions,
        sampled.mask,
        sampled.ended,
        rows,
        spec.supervision == "process",
        spec.format_reward,
        learner.delimiter,
        spec.step_checker,
        spec.answer_match,
    )
    labelling = time.time()
    shares: list[list[float] | None] = [None] * N
    if spec.supervision == "process" and rm is None and spec.step_checker == "rollouts" and not spec.rewards:
        shares = label_by_rollouts(learner, sampled, judged, rows)
        judged.verdicts = [labels_from_shares(s, spec.label_estimate) for s in shares]
    labelling = time.time() - labelling
    # the rules' labels, shown beside the rewards; rollouts label the steps only when their labels are the rewards
    labelled = spec.supervision == "process" and (spec.step_checker != "rollouts" or (rm is None and not spec.rewards))
    labels: list[list[float] | None] = list(judged.verdicts) if labelled else [None] * N
    if spec.rewards:  # the run's named rewards (reward_functions) replace the rule's: outcome rewards or step rewards
        judged.outcome, judged.verdicts = named_rewards(spec, judged, rows, sampled.mask.sum(dim=1).long().tolist())
    components = [dict(c) for _, c in judged.outcome]
    scores = rm.score(rm_examples(judged, rows, rm.kind, labelled=False)) if rm is not None else None
    step_rewards: list[list[float] | None] = [None] * N
    step_ends: list[list[int] | None] = [None] * N
    if spec.supervision == "outcome":
        flat = [s[0] for s in scores] if scores is not None else [r for r, _ in judged.outcome]
        flat = penalise_overlong(spec, flat, sampled.mask, components)  # overlong_penalty: DAPO's length penalty
        rewards = torch.tensor(flat, device=learner.dev).view(-1, G)  # (B, G)
        adv = outcome_advantages(rewards, scale=spec.scale_rewards, batch_std=batch_std(learner, flat))  # (B, G)
        advantages = adv.view(-1, 1) * sampled.mask  # every token of o_i gets A_i
        rewards = rewards.view(-1)
        group_rewards = [rewards[b * G : (b + 1) * G].tolist() for b in range(B)]
    else:
        step_rewards = scores if scores is not None else judged.verdicts
        step_rewards = penalise_overlong(spec, step_rewards, sampled.mask, components)  # on each last step
        step_ends = judged.step_ends
        std = batch_std(learner, [r for rs in step_rewards for r in rs])
        adv_rows = [
            process_advantages(
                step_rewards[b * G : (b + 1) * G],
                step_ends[b * G : (b + 1) * G],
                T,
                scale=spec.scale_rewards,
                batch_std=std,
            )
            for b in range(B)
        ]  # each (G, T)
        advantages = torch.cat(adv_rows).to(learner.dev) * sampled.mask
        rewards = torch.tensor([sum(r) / len(r) if r else 0.0 for r in step_rewards])
        # process advantages normalise over all step rewards of the group
        group_rewards = [[r for i in range(b * G, (b + 1) * G) for r in step_rewards[i]] for b in range(B)]
    if scores is not None:  # the RM's own score (before any overlong penalty): ORM its score, PRM its steps' mean
        for c, s in zip(components, scores):
            c["rm_score"] = sum(s) / len(s) if s else 0.0
    return Scored(
        judged.texts,
        judged.tokens,
        components,
        rewards,
        group_rewards,
        advantages.to(learner.dev),
        step_rewards,
        step_ends,
        labelling,
        labels,
        shares,
    )


def batch_std(learner: Learner, values: list[float]) -> float | None:
    """scale_rewards 'batch': the population std of every process's ``values`` (rewards, or step rewards); None
    for the other scales, which need no gather."""
    if learner.spec.scale_rewards != "batch":
        return None
    every = learner.procs.gather(values)
    return torch.tensor(every).std(unbiased=False).item() if every else 0.0


def label_by_rollouts(learner: Learner, sampled: Sampled, judged: Judged, rows: list[dict]) -> list[list[float]]:
    """Each step's share of continuations that reach the answer (rollout_labels.rollout_shares: the run's
    label_rollouts continuations, by the policy or the run's label_completer)."""
    spec = learner.spec
    learner.policy.eval()
    return rollout_shares(
        learner.unwrapped(),
        learner.tokenizer,
        sampled.prompt_ids,
        sampled.prompt_attn,
        sampled.completions,
        judged.step_ends,
        judged.texts,
        [r["answer"] for r in rows],
        n=spec.label_rollouts,
        max_new_tokens=spec.max_new_tokens,
        temperature=spec.temperature,
        top_p=spec.top_p,
        end_ids=learner.end_ids,
        completer=learner.completer,
        questions=[r["question"] for r in rows],
        tokens=judged.tokens,
        match=spec.answer_match,
    )


def logprobs(model, mb: MicroBatch, s: Sampled, temperature: float, entropy: bool = True):
    """log pi and entropy (None without ``entropy``) of the completion tokens of micro-batch ``mb`` under ``model``,
    each prompt run once (forwards.micro_batch_logprobs), (n, T) each."""
    return micro_batch_logprobs(model, mb, s.prompt_ids, s.prompt_attn, s.completions, s.mask, temperature, entropy)


def reference_and_old_logprobs(learner: Learner, s: Sampled, chunks: list[MicroBatch]):
    """log pi_ref (None when kl_coef is 0) and log pi_old (None when mu = 1: pi_old's log-probs are then the
    detached current ones), each (N, T) in the step's sequence order. The passes run in inference mode (no
    autograd bookkeeping); their results are copied out of it, as the loss's backward may keep them."""
    spec = learner.spec
    ref_logp = old_logp = None
    with torch.inference_mode():
        if spec.kl_coef > 0:
            ref_logp = in_step_order([learner.ref_logprobs(c, s) for c in chunks], chunks)
        if spec.policy_updates_per_batch > 1:
            model = learner.unwrapped()
            with learner.autocast():  # as the update's passes, so that the first update's ratio is exactly 1
                old_logp = in_step_order(
                    [logprobs(model, c, s, spec.temperature, entropy=False)[0] for c in chunks], chunks
                )
    return (None if ref_logp is None else ref_logp.clone()), (None if old_logp is None else old_logp.clone())


def update(
    learner: Learner,
    s: Sampled,
    advantages,
    ref_logp,
    old_logp,
    chunks: list[MicroBatch],
    detail: bool = False,
    steps: bool = True,
) -> dict:
    """4. mu policy updates maximising J_GRPO; the gradient of each is accumulated over the micro-batches: a
    micro-batch's loss is its part of J's sum divided by the whole batch's denominator (objective.aggregate), so
    they add up to the whole batch's loss. ``steps`` False (every advantage 0: carries_signal) measures the
    update without stepping the optimizer. With several processes the gradients are averaged across them once, at
    the last micro-batch; each process's denominator (objective.loss_denominator) makes that average the whole
    batch's loss (loss_type 'dapo' counts every process's tokens: one sum across them before the updates).

    The loss counts the tokens of overlong.loss_mask: every real token, or with mask_truncated only those of the
    outputs that ended (a truncated output is then in neither the sums nor the denominators). Returns this process's sums: ``per_update`` [loss, kl x tokens, clip x tokens] for each
    update, the last update's ``entropy`` summed over tokens, the last ``grad_norm`` (before clipping), the
    ``tokens`` the loss counted and, with ``detail``, the last update's per-token view (``token_detail``)."""
    spec, policy, optimizer = learner.spec, learner.policy, learner.optimizer
    mask = loss_mask(s.mask, s.ended, spec.mask_truncated)  # (N, T)
    tokens = mask.sum().item()
    outputs = max(1, int((mask.sum(dim=1) > 0).sum().item()))  # those the loss counts: N unless mask_truncated
    all_tokens = learner.procs.sum([tokens])[0] if spec.loss_type == "dapo" else tokens
    denominator = loss_denominator(spec.loss_type, outputs, tokens, all_tokens, learner.procs.n, spec.max_new_tokens)
    policy.train()
    grad_norm, entropy_sum, per_update, views = 0.0, 0.0, [], []
    for u in range(spec.policy_updates_per_batch):
        optimizer.zero_grad(set_to_none=True)
        loss_sum = kl_sum = clip_sum = entropy_sum = 0.0
        for k, mb in enumerate(chunks):
            c = mb.rows.to(mask.device)
            with learner.accelerator.no_sync(policy) if k < len(chunks) - 1 else nullcontext():
                with learner.autocast():
                    logp, ent = logprobs(policy, mb, s, spec.temperature)
                old = old_logp[c] if old_logp is not None else logp.detach()
                ref = ref_logp[c] if ref_logp is not None else logp.detach()
                loss, stats = grpo_loss(
                    logp,
                    old,
                    ref,
                    advantages[c],
                    mask[c],
                    spec.clip_eps,
                    spec.kl_coef,
                    spec.clip_eps_upper,
                    spec.ratio_level,
                    spec.loss_type,
                    denominator,
                )
                learner.accelerator.backward(loss)
            if detail and u == spec.policy_updates_per_batch - 1:
                views.append(token_view(old, ref_logp[c] if ref_logp is not None else None, stats))
            loss_sum += loss.item()
            chunk_tokens = mask[c].sum().item()
            kl_sum += stats["kl"].item() * chunk_tokens  # the stats are token means: weight them by tokens
            clip_sum += stats["clip_frac"].item() * chunk_tokens
            entropy_sum += (ent.detach() * mask[c]).sum().item()
        grad_norm = learner.accelerator.clip_grad_norm_(learner.params, 1.0).item()
        if steps:
            optimizer.step()
        per_update += [loss_sum, kl_sum, clip_sum]
    sums = {"per_update": per_update, "entropy": entropy_sum, "grad_norm": grad_norm, "tokens": tokens}
    if views:
        sums["detail"] = {
            k: in_step_order([v[k] for v in views], chunks) if views[0][k] is not None else None for k in views[0]
        }
    return sums


def token_view(old_logp, ref_logp, stats: dict) -> dict[str, torch.Tensor | None]:
    """One micro-batch's per-token view of the update, on the CPU (recorded with the groups): log pi_old (the
    policy at sampling), log pi_ref (None without a reference), the ratio, the k3 KL and whether the clip bound."""

    def cpu(t):
        return None if t is None else t.detach().float().cpu()

    return {
        "logprobs": cpu(old_logp),
        "ref_logprobs": cpu(ref_logp),
        "ratios": cpu(stats["token_ratio"]),
        "kls": cpu(stats["token_kl"]) if ref_logp is not None else None,
        "clipped": cpu(stats["token_clipped"]),
    }


def step_metrics(learner: Learner, s: Sampled, scored: Scored, sums: dict) -> dict[str, float]:
    """5. the step's metrics (recorder.METRICS); with several processes, over the whole batch (values gathered
    in rank order, sums added up)."""
    procs, mu = learner.procs, learner.spec.policy_updates_per_batch
    totals = procs.sum(sums["per_update"] + [sums["entropy"], sums["tokens"]])
    n_tokens = max(totals[-1], 1.0)
    losses = [totals[3 * u] / procs.n for u in range(mu)]
    kls = [totals[3 * u + 1] / n_tokens for u in range(mu)]
    clips = [totals[3 * u + 2] / n_tokens for u in range(mu)]
    group_rewards = procs.gather(scored.group_rewards)
    correct = [c["correct"] for c in scored.components]
    lengths = s.mask.sum(dim=1).long().tolist()
    outputs = procs.gather(list(zip(scored.rewards.tolist(), correct, lengths, s.ended.tolist())))
    all_rewards = torch.tensor([o[0] for o in outputs])
    grad_norm = sums["grad_norm"]
    return {
        "reward_mean": all_rewards.mean().item(),
        "reward_std": all_rewards.std(unbiased=False).item(),
        "correct_frac": sum(o[1] for o in outputs) / len(outputs),
        "zero_std_frac": sum(len(set(g)) <= 1 for g in group_rewards) / len(group_rewards),
        "loss": sum(losses) / mu,
        "kl": sum(kls) / mu,
        "clip_frac": sum(clips) / mu,
        "entropy": totals[-2] / n_tokens,
        "completion_len": float(sum(o[2] for o in outputs)) / len(outputs),
        "truncated_frac": 1.0 - sum(o[3] for o in outputs) / len(outputs),
        "learning_rate": learner.optimizer.param_groups[0]["lr"],
        "grad_norm": grad_norm if math.isfinite(grad_norm) else -1.0,
        "repetition": sum(procs.gather([repetition_share(t) for t in scored.texts])) / len(outputs),
        "answer_stated_frac": sum(procs.gather([float(extract_final_answer(t)[0] is not None) for t in scored.texts]))
        / len(outputs),
        **gradient_sources(procs, s, scored, learner.spec.group_size),
    }


def repetition_share(text: str) -> float:
    """The share of an output's word 3-grams that repeat an earlier one (0: none; the ``repetition`` reward's
    penalty at weight 1, reward_functions.repetition_reward).

    >>> repetition_share("a b a b a b"), repetition_share("one two three four")
    (0.5, 0.0)
    """
    return -repetition_reward("", text, "") / REPETITION_MAX_PENALTY + 0.0  # + 0.0: no -0.0


def gradient_sources(procs: Processes, s: Sampled, scored: Scored, G: int) -> dict[str, float]:
    """Where the step's gradient came from: how many groups the verifier found all right, all wrong or mixed,
    and how many had rewards all equal (zero spread: advantages 0); the shares of real tokens whose advantage was
    positive, negative or zero. Over every process's groups and tokens."""
    correct = [c["correct"] > 0 for c in scored.components]
    kinds = [sum(correct[b * G : (b + 1) * G]) for b in range(len(correct) // G)]  # right answers per group
    spreads = [len(set(g)) > 1 for g in scored.group_rewards]
    groups = procs.gather([(k, spread) for k, spread in zip(kinds, spreads)])
    mask = s.mask > 0
    adv = scored.advantages
    positive, negative, tokens = procs.sum(
        [float(((adv > 0) & mask).sum()), float(((adv < 0) & mask).sum()), float(mask.sum())]
    )
    tokens = max(tokens, 1.0)
    return {
        "groups/all_right": float(sum(k == G for k, _ in groups)),
        "groups/all_wrong": float(sum(k == 0 for k, _ in groups)),
        "groups/mixed": float(sum(0 < k < G for k, _ in groups)),
        "groups/zero_spread": float(sum(not spread for _, spread in groups)),
        "tokens/adv_pos": positive / tokens,
        "tokens/adv_neg": negative / tokens,
        "tokens/adv_zero": (tokens - positive - negative) / tokens,
    }


def group_records(
    s: Sampled, scored: Scored, G: int, prompt: Callable[[str], str], detail: dict | None = None
) -> list[GroupRecord]:
    """This process's groups as the store keeps them: the question and the prompt text the model saw (``prompt``:
    the run's template), each output's text, tokens, reward and advantages, whether it was cut, and the update's
    per-token view (``detail``: update's token_view over the batch; None when no update was made)."""
    lengths = s.mask.sum(dim=1).long().tolist()
    # each (N, T) tensor to nested lists in one call: indexing a tensor row by row costs microseconds a row, and
    # the worker records every step
    adv, rewards, ended = scored.advantages.tolist(), scored.rewards.tolist(), s.ended.tolist()
    rows = {name: values.tolist() for name, values in (detail or {}).items() if values is not None}

    def per_token(name: str, i: int) -> list | None:
        return rows[name][i][: lengths[i]] if name in rows else None

    groups = []
    for b, question in enumerate(s.batch):
        samples = [
            SampleRecord(
                completion=scored.texts[i],
                tokens=scored.tokens[i],
                reward=rewards[i],
                advantages=adv[i][: lengths[i]],
                step_rewards=scored.step_rewards[i],
                step_end_indices=scored.step_ends[i],
                reward_components=scored.components[i],
                step_labels=scored.step_labels[i],
                step_shares=scored.step_shares[i],
                truncated=not ended[i],
                logprobs=per_token("logprobs", i),
                ref_logprobs=per_token("ref_logprobs", i),
                ratios=per_token("ratios", i),
                kls=per_token("kls", i),
                clipped=per_token("clipped", i),
            )
            for i in range(b * G, (b + 1) * G)
        ]
        groups.append(
            GroupRecord(
                prompt=question["question"],
                reference=question["answer"],
                samples=samples,
                model_prompt=prompt(question["question"]),
            )
        )
    return groups
