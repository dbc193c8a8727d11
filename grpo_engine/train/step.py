"""One GRPO step: the body of Algorithm 1's inner loop, read top to bottom.

    1. sample G outputs for each of this process's B questions from pi_old (the current policy, no grad)
    2. score every output: the rules judge it (and give the true verdict "correct"); with reward: model the
       ORM's score is r_i, or the PRM's scores are the step rewards
    3. advantages: outcome (4.1.2) or process (4.1.3) supervision; the reference's and pi_old's log-probs
    4. mu policy updates maximising J_GRPO (Eq. 3) with the k3 KL penalty (Eq. 4)
    5. the step's metrics and groups; with several processes, metrics over the whole batch

``Learner`` (learner.py) holds what the step trains and samples with, ``Sampled`` its sampled outputs and
``Scored`` what each got; step_report.py computes the step's metrics and recorded groups; train() (trainer.py)
runs the steps, evaluates, refreshes the reward model, records and checkpoints.

Shapes: B questions (in one process: its B / devices), G outputs each, N = B*G sequences, P prompt tokens,
T completion tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from grpo_engine.algo.dynamic_sampling import UPDATE_METRICS, Filled, informative_batch, no_update
from grpo_engine.algo.objective import LossSettings, grpo_loss, loss_denominator, outcome_advantages, process_advantages
from grpo_engine.algo.overlong import loss_mask, penalise_overlong
from grpo_engine.report.recorder import GroupRecord
from grpo_engine.rewards.reward_functions import named_rewards, reward_means
from grpo_engine.rollout.forwards import MicroBatch, in_step_order, plan_micro_batches
from grpo_engine.rollout.outputs import Judged, encode_prompts, judge, rm_examples
from grpo_engine.rollout.rollout_labels import Continuing, StepOutputs, labels_from_shares, rollout_shares
from grpo_engine.rollout.sampling import generate
from grpo_engine.rollout.tokenization import completion_mask
from grpo_engine.train.learner import Learner, Sampled, Scored, logprobs
from grpo_engine.train.sharding import local_value
from grpo_engine.train.step_report import group_records, step_metrics, token_view


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
    filled = Filled(
        sampled=sampled, scored=scored, drawn=float(spec.batch_size), dropped=0.0, trains=True, sampling=sampling
    )
    if spec.skip_zero_spread:
        filled = informative_batch(
            (sampled, scored, sampling),
            lambda m: sample_scored(learner, more(m)),
            len(batch),
            max_resample=spec.max_resample,
            G=spec.group_size,
            procs=learner.procs,
            pad_id=learner.tokenizer.pad_token_id,
        )
    sampled, scored = filled.sampled, filled.scored
    steps = filled.trains and carries_signal(learner, scored.advantages)  # whether the optimizer steps
    chunks = plan_micro_batches(sampled.mask, sampled.prompt_attn, spec.group_size, spec.micro_batch_size)
    ref_logp, old_logp = reference_and_old_logprobs(learner, sampled, chunks) if filled.trains else (None, None)
    t2 = time.time()
    sums = (
        update(
            learner,
            sampled,
            scored.advantages,
            ref_logp=ref_logp,
            old_logp=old_logp,
            chunks=chunks,
            detail=record,
            steps=steps,
        )
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
    with learner.gathered():  # a sharded policy: each process decodes (and labels steps) as far as it needs
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
        batch=batch,
        prompt_ids=prompts["input_ids"].repeat_interleave(G, dim=0),
        prompt_attn=prompts["attention_mask"].repeat_interleave(G, dim=0),
        completions=completions,
        mask=mask,
        ended=ended,
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
        process=spec.supervision == "process",
        format_weight=spec.format_reward,
        delimiter=learner.delimiter,
        checker=spec.step_checker,
        match=spec.answer_match,
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
        for c, s in zip(components, scores, strict=True):
            c["rm_score"] = sum(s) / len(s) if s else 0.0
    return Scored(
        texts=judged.texts,
        tokens=judged.tokens,
        components=components,
        rewards=rewards,
        group_rewards=group_rewards,
        advantages=advantages.to(learner.dev),
        step_rewards=step_rewards,
        step_ends=step_ends,
        labelling=labelling,
        step_labels=labels,
        step_shares=shares,
        readings=judged.readings,
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
    outputs = StepOutputs.judged(sampled.prompt_ids, sampled.prompt_attn, sampled.completions, judged, rows)
    how = Continuing.for_run(spec, learner.end_ids)
    return rollout_shares(learner.unwrapped(), learner.tokenizer, outputs, how, completer=learner.completer)


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
    *,
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
    denominator = loss_denominator(
        spec.loss_type,
        outputs,
        tokens,
        all_tokens=all_tokens,
        processes=learner.procs.n,
        max_new_tokens=spec.max_new_tokens,
    )
    settings = LossSettings(spec.clip_eps, spec.kl_coef, spec.clip_eps_high, spec.ratio_level, spec.loss_type)
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
                    settings=settings,
                    denominator=denominator,
                )
                learner.accelerator.backward(loss)
            if detail and u == spec.policy_updates_per_batch - 1:
                views.append(token_view(old, ref_logp[c] if ref_logp is not None else None, stats))
            loss_sum += loss.item()
            chunk_tokens = mask[c].sum().item()
            kl_sum += stats["kl"].item() * chunk_tokens  # the stats are token means: weight them by tokens
            clip_sum += stats["clip_frac"].item() * chunk_tokens
            entropy_sum += (ent.detach() * mask[c]).sum().item()
        grad_norm = local_value(learner.accelerator.clip_grad_norm_(learner.params, 1.0))
        if steps:
            optimizer.step()
        per_update += [loss_sum, kl_sum, clip_sum]
    sums = {"per_update": per_update, "entropy": entropy_sum, "grad_norm": grad_norm, "tokens": tokens}
    if views:
        sums["detail"] = {
            k: in_step_order([v[k] for v in views], chunks) if views[0][k] is not None else None for k in views[0]
        }
    return sums
