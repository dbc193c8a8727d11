"""Outputs cut at max_new_tokens (DAPO, Yu et al. 2025, arXiv 2503.14476, section 3.4), both off by default.

An output cut at the length limit has no final answer, so its 0 reward punishes reasoning that may have been
sound: noise in the reward. DAPO offers two remedies, run-spec keys here:

* ``mask_truncated`` (overlong filtering): :func:`loss_mask` leaves every truncated output out of the loss;
* ``overlong_penalty`` with ``overlong_buffer`` (soft overlong punishment): :func:`overlong_penalty` takes a
  reward that ramps down to -overlong_penalty over the last ``overlong_buffer`` tokens before the limit, so the
  policy learns to finish in time; :func:`add_overlong_penalty` adds it to the outputs' rewards before the
  advantages are computed.

Pure functions; torch only for the mask.
"""

from __future__ import annotations

import torch


def loss_mask(mask: torch.Tensor, ended: torch.Tensor, mask_truncated: bool) -> torch.Tensor:
    """The tokens the loss counts: ``mask`` (every real token), or with ``mask_truncated`` only those of outputs
    that ended (an end token before max_new_tokens): loss_mask[i,t] = mask[i,t] * ended[i].

    mask: (N, T) float; ended: (N,) bool. Returns (N, T); ``mask`` itself when off.
    Example: mask [[1, 1, 0], [1, 1, 1]], ended [True, False] -> [[1, 1, 0], [0, 0, 0]].
    """
    if not mask_truncated:
        return mask
    return mask * ended.to(mask.dtype).unsqueeze(1)


def overlong_penalty(length: int, max_new_tokens: int, buffer: int, penalty: float) -> float:
    """DAPO's soft overlong punishment of an output of ``length`` tokens (its end token included):

        R_length(L) = 0                                 L <= Lmax - Lc
                    = ((Lmax - Lc) - L) / Lc * penalty  Lmax - Lc < L <= Lmax

    with Lmax = max_new_tokens, Lc = buffer: a linear ramp from 0 to -penalty at Lmax (a truncated output has
    L = Lmax).
    Example, Lmax 32, Lc 8, penalty 1: L 24 -> 0; L 28 -> -0.5; L 32 -> -1.0.

    >>> [overlong_penalty(n, 32, 8, 1.0) for n in (24, 28, 32)]
    [0.0, -0.5, -1.0]
    """
    start = max_new_tokens - buffer
    if length <= start:
        return 0.0
    return (start - length) / buffer * penalty


def add_overlong_penalty(
    rewards: list,
    lengths: list[int],
    components: list[dict[str, float]],
    *,
    max_new_tokens: int,
    buffer: int,
    penalty: float,
) -> list:
    """Each output's reward with its :func:`overlong_penalty` added, and the penalty recorded in its
    ``components`` as "overlong"; ``rewards`` unchanged (and nothing recorded) when ``penalty`` is 0.

    rewards: one per output, a float (outcome supervision: r_i) or a list of step rewards (process supervision:
    the penalty goes to the last step's reward; an output without steps has nothing to add it to). lengths: each
    output's tokens (its end token included).
    Example, Lmax 32, Lc 8, penalty 2: rewards [1.0, [1.0, 0.0]] of lengths [28, 32] -> [0.0, [1.0, -2.0]].
    """
    if not penalty:
        return rewards
    out = []
    for reward, length, comps in zip(rewards, lengths, components, strict=True):
        p = overlong_penalty(length, max_new_tokens, buffer, penalty)
        comps["overlong"] = p
        if isinstance(reward, list):
            out.append(reward[:-1] + [reward[-1] + p] if reward else reward)
        else:
            out.append(reward + p)
    return out


def penalise_overlong(spec, rewards: list, mask: torch.Tensor, components: list[dict[str, float]]) -> list:
    """:func:`add_overlong_penalty` with a run's settings (RunSpec: max_new_tokens, overlong_buffer,
    overlong_penalty) on outputs whose real tokens are ``mask`` (N, T); ``rewards`` unchanged when it is off."""
    if not spec.overlong_penalty:
        return rewards
    return add_overlong_penalty(
        rewards,
        mask.sum(dim=1).long().tolist(),
        components,
        max_new_tokens=spec.max_new_tokens,
        buffer=spec.overlong_buffer,
        penalty=spec.overlong_penalty,
    )
