"""GRPO's equations, one pure function each (DeepSeekMath, arXiv 2402.03300, section 4.1).

Shapes: ``B`` questions, ``G`` outputs per question, ``N = B*G`` outputs, ``T`` completion tokens
(padded). ``mask`` is 1.0 on real completion tokens (up to and including EOS) and 0.0 on padding.
docs/algorithm.md states each equation with the worked numbers the tests use.

The paper's GRPO is every default. The variants practitioners know from TRL and verl are arguments of the same
functions, each its own small equation: how advantages are scaled (``advantage_divisor``: scale_rewards), how the
ratio is formed (``sequence_ratio``: ratio_level, GSPO), where it is clipped (``clipped_surrogate``: clip_eps_high,
DAPO) and how the per-token terms are summed and divided (``aggregate`` and ``loss_denominator``: loss_type).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ADV_EPS = 1e-4  # eps' in the normalisations: keeps a division by a tiny std finite
KL_LINEAR_FROM = 10.0  # k3 beyond this log-ratio continues along its tangent: finite, and still pulling back


def advantage_divisor(scale: str, group_std: torch.Tensor, batch_std: float | None, eps: float = ADV_EPS):
    """What a reward's deviation from its group's mean is divided by (run-spec key scale_rewards).

    'group': std of the group + eps' (the paper); 'batch': std of every reward of the batch + eps' (``batch_std``,
    all processes' rewards; PPO Lite); 'none': 1, no division (Dr. GRPO: the std favours groups whose rewards
    barely differ, i.e. questions that are too easy or too hard). Stds are population stds.
    ``group_std``: a tensor (one std per group, or the group's); returns a tensor or 1.0 that broadcasts with it.

    >>> advantage_divisor("group", torch.tensor(0.5), None), advantage_divisor("batch", torch.tensor(0.5), 0.25)
    (tensor(0.5001), tensor(0.2501))
    >>> advantage_divisor("none", torch.tensor(0.5), None)
    1.0
    """
    if scale == "none":
        return 1.0
    if scale == "batch":
        return torch.as_tensor(batch_std, dtype=group_std.dtype, device=group_std.device) + eps
    return group_std + eps


def outcome_advantages(
    rewards: torch.Tensor, eps: float = ADV_EPS, scale: str = "group", batch_std: float | None = None
) -> torch.Tensor:
    """Outcome supervision (section 4.1.2): A_hat[i,t] = (r_i - mean(r)) / (std(r) + eps').

    rewards: (B, G) one reward per output. Returns (B, G): the advantage of every token of o_i.
    std is the population std (divide by G). ``scale`` (scale_rewards) chooses the divisor,
    :func:`advantage_divisor`: 'batch' divides by ``batch_std`` (None: the std of all of ``rewards``), 'none' by
    nothing. A group whose rewards are all equal gets exactly 0 whatever the scale.
    Example: rewards [[0, 1, 0]] -> [[-0.7071, 1.4142, -0.7071]]; 'none': [[-0.3333, 0.6667, -0.3333]].
    Rewards [[1, 0, 0, 0], [1, 1, 0, 0]] with 'batch': mean of the batch's 8 rewards 0.375, std 0.4841 ->
    [[1.5489, -0.5163 x3], [1.0326 x2, -1.0326 x2]] (the group means 0.25 and 0.5 stay each group's).
    """
    mean = rewards.mean(dim=1, keepdim=True)  # (B, 1)
    std = rewards.std(dim=1, keepdim=True, unbiased=False)  # (B, 1)
    if scale == "batch" and batch_std is None:
        batch_std = rewards.std(unbiased=False).item()
    adv = (rewards - mean) / advantage_divisor(scale, std, batch_std, eps)
    same = (rewards == rewards[:, :1]).all(dim=1, keepdim=True)  # (B, 1); exact test, float std may not be 0
    return torch.where(same, torch.zeros_like(adv), adv)


def process_advantages(
    step_rewards: list[list[float]],
    step_ends: list[list[int]],
    length: int,
    eps: float = ADV_EPS,
    scale: str = "group",
    batch_std: float | None = None,
) -> torch.Tensor:
    """Process supervision (section 4.1.3) for ONE group of G outputs.

    step_rewards[i][j]: reward of step j of output i; step_ends[i][j]: 0-based token index where
    that step ends (ascending). length: T, the padded completion length.
    R = all step rewards of the group; r~ = (r - mean(R)) / (std(R) + eps') (population std);
    A_hat[i,t] = sum of r~ over the steps j of o_i with end(j) >= t; 0 after the last step.
    ``scale`` (scale_rewards, :func:`advantage_divisor`): 'batch' divides by ``batch_std``, the std of every step
    reward of the batch (required then); 'none' by nothing. mean(R) is always the group's.
    Returns (G, T). An all-equal R gives all zeros.
    Example: R = {1, 1, 0, 1} (mean 0.75) and batch_std 0.5: r~ = +0.4999 for a 1, -1.4997 for a 0.
    """
    flat = torch.tensor([r for rs in step_rewards for r in rs], dtype=torch.float32)  # (|R|,)
    adv = torch.zeros(len(step_rewards), length)  # (G, T)
    if flat.numel() == 0:
        return adv
    if bool((flat == flat[0]).all()):  # all step rewards equal: nothing to learn from this group
        return adv
    mean = flat.mean()
    divisor = advantage_divisor(scale, flat.std(unbiased=False), batch_std, eps)
    for i, (rewards, ends) in enumerate(zip(step_rewards, step_ends, strict=True)):
        for r, end in zip(rewards, ends, strict=True):
            # this step's normalised reward counts for every token up to and including its end
            adv[i, : min(end, length - 1) + 1] += (r - mean) / divisor
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


def sequence_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO's sequence-level ratio (Zheng et al. 2025, arXiv 2507.18071), in its GSPO-token form, per token.

    s_i = exp( (1/|o_i|) sum_t (logp[i,t] - old_logp[i,t]) )   the length-normalised ratio of o_i, real tokens only
    ratio[i,t] = sg[s_i] * pi_theta(o_{i,t}) / sg[pi_theta(o_{i,t})]   (sg: no gradient)
    Its value is s_i on every token of o_i; its gradient flows through each token's own log-prob,
    d ratio[i,t] / d logp[i,t] = s_i, so per-token advantages (process supervision) still weigh each token, and with
    one advantage per output the gradient is GSPO's. logp, old_logp, mask: (N, T). Returns (N, T).
    Example: log-ratios (0.1, 0.3, -0.1) -> s = e^0.1 = 1.1052 on each token; (0.5, 0.1) -> e^0.3 = 1.3499
    (per token the ratios would be 1.6487 and 1.1052).
    """
    mean_log_ratio = masked_mean_per_output(logp - old_logp, mask).unsqueeze(1)  # (N, 1)
    return torch.exp(mean_log_ratio).detach() * torch.exp(logp - logp.detach())


def clipped_surrogate(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    clip_eps: float,
    *,
    clip_eps_high: float = 0.0,
    mask: torch.Tensor | None = None,
    level: str = "token",
) -> tuple[torch.Tensor, torch.Tensor]:
    """min(rho * A, clip(rho, 1-eps, 1+eps_high) * A) per token.

    rho = exp(logp - old_logp) per token (``level`` 'token', the paper), or GSPO's :func:`sequence_ratio` (level
    'sequence': needs ``mask``; one value per output, so the clip acts per output). eps_high (``clip_eps_high``,
    DAPO's clip-higher) bounds the ratio above; 0: eps (the paper's symmetric clip; the one place that rule lives). logp, old_logp, advantages: (N, T). Returns
    (surrogate, clipped) both (N, T); ``clipped`` is 1.0 where the clipped term was the smaller one and differs
    from the unclipped (the clip was active).
    Example, eps 0.2, eps_high 0.28: rho 1.25, A 2 -> 2.5 (inside; symmetric 0.2 would give 1.2 * 2 = 2.4);
    rho 1.5, A 2 -> 1.28 * 2 = 2.56; rho 0.5, A -2 -> 0.8 * -2 = -1.6 (below, as with eps alone).
    """
    ratio = sequence_ratio(logp, old_logp, mask) if level == "sequence" else torch.exp(logp - old_logp)
    unclipped = ratio * advantages
    high = clip_eps_high or clip_eps
    clipped_ratio = ratio.clamp(1.0 - clip_eps, 1.0 + high)
    clipped = clipped_ratio * advantages
    surrogate = torch.minimum(unclipped, clipped)
    active = (clipped < unclipped).float()
    return surrogate, active


def masked_mean_per_output(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(1/|o_i|) * sum_t values[i,t] over real tokens. values, mask: (N, T) -> (N,)."""
    return (values * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


def aggregate(values: torch.Tensor, mask: torch.Tensor, loss_type: str, denominator: float) -> torch.Tensor:
    """J's aggregation of per-token terms (run-spec key loss_type): a sum over this batch, divided by ``denominator``.

    'grpo' (the paper):  sum_i (1/|o_i|) sum_t values[i,t]   / denominator (N: mean over outputs of their token means)
    'bnpo', 'dapo', 'dr_grpo':  sum_i sum_t values[i,t]      / denominator (tokens, or N x max_new_tokens)
    Real tokens only. Because the numerator is a plain sum over outputs, micro-batches whose results are added
    up, each divided by the whole batch's :func:`loss_denominator`, give exactly the whole batch's J and gradient.
    values, mask: (N, T). Returns a scalar.
    Example: o_1 terms (2, 4, 6, pad), o_2 (1, 3, pad, pad): grpo (4 + 2) / 2 = 3.0; bnpo and dapo
    (12 + 4) / 5 tokens = 3.2; dr_grpo with max_new_tokens 4: 16 / (2 x 4) = 2.0.
    """
    if loss_type == "grpo":
        return masked_mean_per_output(values, mask).sum() / denominator
    return (values * mask).sum() / denominator


def loss_denominator(
    loss_type: str, outputs: int, tokens: float, *, all_tokens: float, processes: int, max_new_tokens: int
) -> float:
    """What one process divides its sum by (:func:`aggregate`), so that the average over the ``processes`` (the
    data-parallel gradient average) is the loss_type's J over the whole batch of this update.

    outputs: this process's N (every process has as many); tokens: its real tokens; all_tokens: every process's.
    'grpo':    N                          mean over all outputs of each output's token mean
    'bnpo':    tokens                     token mean over this process's outputs (TRL's "local batch")
    'dapo':    all_tokens / processes     token mean over the whole batch (DAPO)
    'dr_grpo': N x max_new_tokens         token sum / (B x G x max_new_tokens), a constant (Dr. GRPO)
    With one process bnpo and dapo are the same.

    >>> counts = dict(all_tokens=12.0, processes=2, max_new_tokens=4)
    >>> [loss_denominator(t, 2, 5.0, **counts) for t in ("grpo", "bnpo", "dapo", "dr_grpo")]
    [2.0, 5.0, 6.0, 8.0]
    """
    if loss_type == "grpo":
        return float(outputs)
    if loss_type == "bnpo":
        return max(float(tokens), 1.0)
    if loss_type == "dapo":
        return max(float(all_tokens), 1.0) / processes
    return float(outputs * max_new_tokens)


@dataclass(frozen=True)
class LossSettings:
    """The objective's knobs, the run-spec keys of the same names; the defaults are the paper's: clip_eps (eps),
    kl_coef (beta), clip_eps_high (DAPO's clip-higher; 0: eps), ratio_level ('token' or GSPO's 'sequence') and
    loss_type (how the per-token terms are summed and divided, :func:`aggregate`)."""

    clip_eps: float = 0.2
    kl_coef: float = 0.04
    clip_eps_high: float = 0.0
    ratio_level: str = "token"
    loss_type: str = "grpo"


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    settings: LossSettings = LossSettings(),
    denominator: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """loss = -J_GRPO (Eq. 3); by default the paper's.

    J = mean over outputs of (1/|o_i|) sum_t [ min(rho A, clip(rho) A) - beta * KL_k3 ].
    (Every question has G outputs, so the mean over all N outputs equals the mean over questions of
    (1/G) sum_i.) logp, old_logp, ref_logp, advantages, mask: (N, T). Padding carries no loss.
    ``settings`` holds eps, beta and the variants: ``clip_eps_high`` and ``ratio_level`` form the surrogate
    (:func:`clipped_surrogate`), ``loss_type`` and ``denominator`` aggregate it (:func:`aggregate`; None: this call is the whole batch, one
    process, with T standing for max_new_tokens).
    Returns (loss scalar, stats) with stats kl (token mean), clip_frac (share of tokens clipped; at sequence level
    a sequence's tokens are clipped together), and per token (N, T), detached: token_ratio (rho), token_kl,
    token_clipped (1.0 where the clip was active).
    """
    surrogate, clip_active = clipped_surrogate(
        logp,
        old_logp,
        advantages,
        settings.clip_eps,
        clip_eps_high=settings.clip_eps_high,
        mask=mask,
        level=settings.ratio_level,
    )  # (N, T)
    kl = kl_k3(logp, ref_logp)  # (N, T)
    if denominator is None:
        tokens = mask.sum().item()
        denominator = loss_denominator(
            settings.loss_type, mask.shape[0], tokens, all_tokens=tokens, processes=1, max_new_tokens=mask.shape[1]
        )
    loss = -aggregate(surrogate - settings.kl_coef * kl, mask, settings.loss_type, denominator)
    n_tokens = mask.sum().clamp(min=1.0)
    with torch.no_grad():
        ratio = (
            sequence_ratio(logp, old_logp, mask) if settings.ratio_level == "sequence" else torch.exp(logp - old_logp)
        )
    stats = {
        "kl": ((kl * mask).sum() / n_tokens).detach(),
        "clip_frac": ((clip_active * mask).sum() / n_tokens).detach(),
        "token_ratio": ratio,
        "token_kl": kl.detach(),
        "token_clipped": clip_active,
    }
    return loss, stats
