"""What a GRPO step reports: its metrics (over the whole batch, with several processes), where its gradient comes
from, each token's view (ratio, KL, advantage) and the groups the dashboard records.

grpo_step (step.py) calls these once its updates are done; they read the step's ``Sampled`` outputs and their
``Scored`` values (learner.py) and change nothing.

Shapes: N = B*G sequences, T completion tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from grpo_engine.report.recorder import GroupRecord, SampleRecord
from grpo_engine.rewards.builtin_rewards import REPETITION_MAX_PENALTY, repetition_reward
from grpo_engine.rewards.rewards import extract_final_answer
from grpo_engine.train.learner import Learner, Sampled, Scored
from grpo_engine.train.parallel import Processes


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
    """5. the step's metrics (metrics.METRICS); with several processes, over the whole batch (values gathered
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
    outputs = procs.gather(list(zip(scored.rewards.tolist(), correct, lengths, s.ended.tolist(), strict=True)))
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
    penalty at weight 1, builtin_rewards.repetition_reward).

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
    groups = procs.gather([(k, spread) for k, spread in zip(kinds, spreads, strict=True)])
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
                answer=scored.readings[i][0] if scored.readings else None,
                answer_rule=scored.readings[i][1] if scored.readings else None,
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
