"""GRPO's equations, one pure function each (DeepSeekMath, arXiv 2402.03300, section 4.1).

Shapes: ``B`` questions, ``G`` outputs per question, ``N = B*G`` outputs, ``T`` completion tokens
(padded). ``mask`` is 1.0 on real completion tokens (up to and including EOS) and 0.0 on padding.
docs/ALGORITHM.md states each equation with the worked numbers the tests use.
"""
from __future__ import annotations

import torch

ADV_EPS = 1e-4  # eps' in the normalisations: keeps a division by a tiny std finite
KL_LINEAR_FROM = 10.0  # k3 beyond this log-ratio continues along its tangent: finite, and still pulling back


def outcome_advantages(rewards: torch.Tensor, eps: float = ADV_EPS) -> torch.Tensor:
    """Outcome supervision (section 4.1.2): A_hat[i,t] = (r_i - mean(r)) / (std(r) + eps').

    rewards: (B, G) one reward per output. Returns (B, G): the advantage of every token of o_i.
    std is the population std (divide by G). A group whose rewards are all equal gets exactly 0.
    Example: rewards [[0, 1, 0]] -> [[-0.7071, 1.4142, -0.7071]].
    """
    mean = rewards.mean(dim=1, keepdim=True)  # (B, 1)
    std = rewards.std(dim=1, keepdim=True, unbiased=False)  # (B, 1)
    adv = (rewards - mean) / (std + eps)
    same = (rewards == rewards[:, :1]).all(dim=1, keepdim=True)  # (B, 1); exact test, float std may not be 0
    return torch.where(same, torch.zeros_like(adv), adv)


def process_advantages(
    step_rewards: list[list[float]], step_ends: list[list[int]], length: int, eps: float = ADV_EPS
) -> torch.Tensor:
    """Process supervision (section 4.1.3) for ONE group of G outputs.

    step_rewards[i][j]: reward of step j of output i; step_ends[i][j]: 0-based token index where
    that step ends (ascending). length: T, the padded completion length.
    R = all step rewards of the group; r~ = (r - mean(R)) / (std(R) + eps') (population std);
    A_hat[i,t] = sum of r~ over the steps j of o_i with end(j) >= t; 0 after the last step.
    Returns (G, T). An all-equal R gives all zeros.
    """
    flat = torch.tensor([r for rs in step_rewards for r in rs], dtype=torch.float32)  # (|R|,)
    adv = torch.zeros(len(step_rewards), length)  # (G, T)
    if flat.numel() == 0:
        return adv
    if bool((flat == flat[0]).all()):  # all step rewards equal: nothing to learn from this group
        return adv
    mean, std = flat.mean(), flat.std(unbiased=False)
    for i, (rewards, ends) in enumerate(zip(step_rewards, step_ends)):
        for r, end in zip(rewards, ends):
            # this step's normalised reward counts for every token up to and including its end
            adv[i, : min(end, length - 1) + 1] += (r - mean) / (std + eps)
    return adv


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """The k3 KL estimator (Eq. 4): pi_ref/pi_theta - log(pi_ref/pi_theta) - 1, per token, >= 0.

    logp, ref_logp: (N, T) log-probs of the sampled tokens under pi_theta and pi_ref. With x = ref_logp - logp,
    k3(x) = e^x - x - 1. For x > KL_LINEAR_FROM (= c, the policy gives the token e^c times less than the
    reference) e^x would overflow, so k3 continues along its tangent at c: k3(c) + (e^c - 1)(x - c). It stays
    finite and convex, and its gradient -(e^c - 1) per token keeps pulling the policy back (a clamp of x would
    make it a constant with zero gradient exactly when the policy has drifted furthest). For x < 0, e^x -> 0
    and k3 is already about -x - 1.
    Examples: pi_ref/pi_theta = 2 -> 2 - ln 2 - 1 = 0.3069; x = 30 -> e^10 - 11 + (e^10 - 1) * 20 = 462,524.8
    with d k3 / d logp = -(e^10 - 1) = -22,025.5.
    """
    x = ref_logp - logp
    c = torch.full_like(x, KL_LINEAR_FROM)
    inside = torch.minimum(x, c)  # e^x is only ever taken up to c
    beyond = (x - c).clamp(min=0.0)
    return torch.exp(inside) - inside - 1.0 + (torch.exp(c) - 1.0) * beyond


def clipped_surrogate(
    logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, clip_eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """min(rho * A, clip(rho, 1-eps, 1+eps) * A) per token, with rho = exp(logp - old_logp).

    logp, old_logp, advantages: (N, T). Returns (surrogate, clipped) both (N, T); ``clipped`` is 1.0
    where the clipped term was the smaller one and differs from the unclipped (the clip was active).
    """
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * advantages
    clipped_ratio = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps)
    clipped = clipped_ratio * advantages
    surrogate = torch.minimum(unclipped, clipped)
    active = (clipped < unclipped).float()
    return surrogate, active


def masked_mean_per_output(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(1/|o_i|) * sum_t values[i,t] over real tokens. values, mask: (N, T) -> (N,)."""
    return (values * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    kl_coef: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """loss = -J_GRPO (Eq. 3) with the paper's aggregation.

    J = mean over outputs of (1/|o_i|) sum_t [ min(rho A, clip(rho) A) - beta * KL_k3 ].
    (Every question has G outputs, so the mean over all N outputs equals the mean over questions of
    (1/G) sum_i.) logp, old_logp, ref_logp, advantages, mask: (N, T). Padding carries no loss.
    Returns (loss scalar, stats) with stats kl (token mean), clip_frac (share of tokens clipped).
    """
    surrogate, clip_active = clipped_surrogate(logp, old_logp, advantages, clip_eps)  # (N, T)
    kl = kl_k3(logp, ref_logp)  # (N, T)
    per_output = masked_mean_per_output(surrogate - kl_coef * kl, mask)  # (N,)
    loss = -per_output.mean()
    n_tokens = mask.sum().clamp(min=1.0)
    stats = {
        "kl": ((kl * mask).sum() / n_tokens).detach(),
        "clip_frac": ((clip_active * mask).sum() / n_tokens).detach(),
    }
    return loss, stats
