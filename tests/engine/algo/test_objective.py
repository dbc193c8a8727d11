"""grpo_engine.algo.objective on hand-computed numbers (docs/algorithm.md), each computation written out."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_engine.algo.objective import (
    ADV_EPS,
    LossSettings,
    clipped_surrogate,
    grpo_loss,
    kl_k3,
    masked_mean_per_output,
    outcome_advantages,
    process_advantages,
)

LN2 = math.log(2.0)


def close(actual: torch.Tensor, expected, tol: float = 1e-5) -> None:
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert torch.allclose(actual, expected, atol=tol, rtol=0), f"\n{actual}\n!=\n{expected}"


# --- outcome supervision (4.1.2) -------------------------------------------------------------


def test_outcome_seed_example():
    # rewards {0, 1, 0}: mean 1/3, deviations -1/3, 2/3, -1/3
    # population variance (1/9 + 4/9 + 1/9) / 3 = 2/9, std sqrt(2)/3 = 0.4714
    # A = dev / std = -0.7071, +1.4142, -0.7071 (eps' = 1e-4 moves them by ~2e-4)
    adv = outcome_advantages(torch.tensor([[0.0, 1.0, 0.0]]))
    close(adv, [[-0.7071, 1.4142, -0.7071]], tol=1e-3)
    std = math.sqrt(2) / 3
    close(adv, [[(-1 / 3) / (std + ADV_EPS), (2 / 3) / (std + ADV_EPS), (-1 / 3) / (std + ADV_EPS)]])


def test_outcome_normalises_each_group_on_its_own():
    rewards = torch.tensor(
        [
            [1.0, 0.0, 0.0, 0.0],  # mean .25; var (.75^2 + 3 * .25^2) / 4 = .1875, std .4330
            [1.0, 1.0, 1.0, 1.0],  # std 0 -> all 0
            [0.0, 0.0, 1.0, 1.0],  # mean .5, std .5 -> -1, -1, +1, +1
            [2.0, 4.0, 4.0, 4.0],  # mean 3.5; var (1.5^2 + 3 * .5^2) / 4 = .75, std .8660
        ]
    )
    s1, s4 = math.sqrt(0.1875), math.sqrt(0.75)
    expected = [
        [0.75 / (s1 + ADV_EPS)] + [-0.25 / (s1 + ADV_EPS)] * 3,  # +1.7321, -0.5774 x3
        [0.0] * 4,
        [-0.5 / (0.5 + ADV_EPS)] * 2 + [0.5 / (0.5 + ADV_EPS)] * 2,  # -1, -1, +1, +1
        [-1.5 / (s4 + ADV_EPS)] + [0.5 / (s4 + ADV_EPS)] * 3,  # -1.7321, +0.5774 x3
    ]
    adv = outcome_advantages(rewards)
    close(adv, expected)
    close(
        adv,
        [[1.7321, -0.5774, -0.5774, -0.5774], [0, 0, 0, 0], [-1, -1, 1, 1], [-1.7321, 0.5774, 0.5774, 0.5774]],
        tol=1e-3,
    )


def test_outcome_uses_population_std():
    # rewards {0, 1}: population std 0.5 -> -1, +1; the sample std (0.7071) would give -0.7071, +0.7071
    close(outcome_advantages(torch.tensor([[0.0, 1.0]])), [[-1.0, 1.0]], tol=1e-3)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("value", [0.0, 1.0, 0.5, 0.1, 0.7])
def test_outcome_zero_std_group_gives_exactly_zero(value, batch):
    # all G rewards equal: std 0, every advantage exactly 0 (docs/algorithm.md, Outcome supervision),
    # also for rewards such as 0.1 whose float32 mean is not exactly the value
    rewards = torch.full((batch, 8), value)
    adv = outcome_advantages(rewards)
    assert torch.equal(adv, torch.zeros(batch, 8)), adv


# --- process supervision (4.1.3) -------------------------------------------------------------


def test_process_seed_example():
    # The seed's example with 1-based token positions converted to 0-based step ends:
    # o1 steps end at t=11, 20 -> 10, 19 (rewards 1, 1); o2 at t=10, 19 -> 9, 18 (rewards 0, 1).
    # R = {1, 1, 0, 1}: mean .75, population std sqrt((3 * .25^2 + .75^2) / 4) = sqrt(.1875) = .4330
    # normalised: 1 -> .25 / .4330 = +0.5774, 0 -> -.75 / .4330 = -1.7321
    # o1: t <= 10 -> .5774 + .5774 = 1.1547; 11..19 -> .5774; t >= 20 -> 0
    # o2: t <= 9 -> -1.7321 + .5774 = -1.1547; 10..18 -> .5774; t >= 19 -> 0
    adv = process_advantages([[1.0, 1.0], [0.0, 1.0]], [[10, 19], [9, 18]], length=24)
    assert adv.shape == (2, 24)
    o1, o2 = adv[0], adv[1]
    for t in (0, 5, 10):
        assert o1[t].item() == pytest.approx(1.1547, abs=1e-3)
    for t in (11, 15, 19):
        assert o1[t].item() == pytest.approx(0.5774, abs=1e-3)
    for t in (20, 23):
        assert o1[t].item() == 0.0
    for t in (0, 9):
        assert o2[t].item() == pytest.approx(-1.1547, abs=1e-3)
    for t in (10, 18):
        assert o2[t].item() == pytest.approx(0.5774, abs=1e-3)
    for t in (19, 23):
        assert o2[t].item() == 0.0
    # exact values with eps'
    std = math.sqrt(0.1875)
    good, bad = 0.25 / (std + ADV_EPS), -0.75 / (std + ADV_EPS)
    close(o1, [2 * good] * 11 + [good] * 9 + [0.0] * 4)
    close(o2, [bad + good] * 10 + [good] * 9 + [0.0] * 5)


@pytest.mark.parametrize("value", [0.0, 1.0, 0.1])
def test_process_all_equal_step_rewards_give_zeros(value):
    adv = process_advantages([[value] * 3, [value] * 4, [value]], [[1, 3, 4], [0, 1, 2, 3], [2]], length=6)
    assert torch.equal(adv, torch.zeros(3, 6)), adv


def test_process_output_without_steps_gets_zeros():
    # R = {1, 0}: mean .5, std .5 -> +1, -1; the third output has no steps
    adv = process_advantages([[1.0], [0.0], []], [[1], [2], []], length=4)
    s = 0.5 / (0.5 + ADV_EPS)
    close(adv, [[s, s, 0, 0], [-s, -s, -s, 0], [0, 0, 0, 0]])


# --- KL, k3 estimator (Eq. 4) ----------------------------------------------------------------


def test_kl_k3_hand_values():
    # pi_theta = .25 and pi_ref = .5: ratio 2 -> 2 - ln 2 - 1 = 0.3069
    # pi_theta = pi_ref = .3: ratio 1 -> 1 - 0 - 1 = 0
    # pi_theta = .5 and pi_ref = .25: ratio .5 -> .5 + ln 2 - 1 = 0.1931
    logp = torch.log(torch.tensor([[0.25, 0.3, 0.5]]))
    ref = torch.log(torch.tensor([[0.5, 0.3, 0.25]]))
    kl = kl_k3(logp, ref)
    close(kl, [[1 - LN2, 0.0, LN2 - 0.5]])
    close(kl, [[0.3069, 0.0, 0.1931]], tol=1e-4)


def test_kl_k3_is_never_negative():
    gen = torch.Generator().manual_seed(0)
    logp = -5 * torch.rand(64, 32, generator=gen)
    ref = -5 * torch.rand(64, 32, generator=gen)
    assert (kl_k3(logp, ref) >= 0).all()


def test_kl_k3_stays_finite_on_huge_differences_and_is_exact_below_the_linear_part():
    logp = torch.tensor([[-1000.0, 0.0, -2.0]], requires_grad=True)
    ref = torch.tensor([[0.0, -1000.0, 0.0]])
    kl = kl_k3(logp, ref)
    # x = 1000: the tangent at 10; x = -1000: e^x - x - 1 = 999 exactly; x = 2: e^2 - 3 (below the tangent's start)
    assert kl[0, 0].item() == pytest.approx(math.exp(10) - 11 + (math.exp(10) - 1) * 990, rel=1e-6)
    assert kl[0, 1].item() == pytest.approx(999.0, rel=1e-6)
    assert kl[0, 2].item() == pytest.approx(math.exp(2) - 3, rel=1e-6)
    kl.sum().backward()
    assert torch.isfinite(logp.grad).all()


def test_kl_k3_at_a_log_ratio_of_30_still_pulls_the_policy_back():
    """pi_ref/pi_theta = e^30: the value is the tangent's (462,524.8, docs/algorithm.md, The KL estimator) and the
    gradient on logp is -(e^10 - 1), not 0: descending the KL raises the token's log-prob."""
    logp = torch.tensor([-30.0], requires_grad=True)
    kl = kl_k3(logp, torch.tensor([0.0]))
    assert kl.item() == pytest.approx(462524.78, rel=1e-6)
    kl.sum().backward()
    assert logp.grad.item() == pytest.approx(-(math.exp(10) - 1), rel=1e-6)
    # continuous where the tangent starts, and the same slope on both sides
    x = torch.tensor([10.0 - 1e-3, 10.0 + 1e-3], dtype=torch.float64)
    k = kl_k3(torch.zeros_like(x), x)
    assert (k[1] - k[0]).item() == pytest.approx(2e-3 * (math.exp(10) - 1), rel=1e-3)


# --- clipped surrogate and the loss (Eq. 3) --------------------------------------------------


def test_clipped_surrogate_when_the_clip_binds_and_when_it_does_not():
    eps = 0.2
    rho = torch.tensor([[1.5, 0.5, 1.5, 0.5, 1.1, 1.5]])
    adv = torch.tensor([[2.0, -2.0, -2.0, 2.0, 2.0, 0.0]])
    surrogate, active = clipped_surrogate(torch.log(rho), torch.zeros_like(rho), adv, eps)
    # rho 1.5, A  2: min(3.0, 1.2 * 2 = 2.4)   = 2.4   clip active
    # rho 0.5, A -2: min(-1.0, 0.8 * -2 = -1.6) = -1.6  clip active
    # rho 1.5, A -2: min(-3.0, 1.2 * -2 = -2.4) = -3.0  not active (unclipped is smaller)
    # rho 0.5, A  2: min(1.0, 0.8 * 2 = 1.6)   = 1.0   not active
    # rho 1.1, A  2: inside [0.8, 1.2], 2.2           not active
    # A 0: 0                                          not active
    close(surrogate, [[2.4, -1.6, -3.0, 1.0, 2.2, 0.0]])
    assert active.tolist() == [[1.0, 1.0, 0.0, 0.0, 0.0, 0.0]]


def test_grpo_loss_with_the_clip_binding():
    # mu > 1: one output of 4 real tokens and 1 padding token, beta = 0
    # token:   rho  A    min(rho A, clip(rho) A)   clip active
    #   0      1.5  2    min(3.0, 2.4)  = 2.4       yes
    #   1      0.5 -2    min(-1.0, -1.6) = -1.6     yes
    #   2      1.5 -1    min(-1.5, -1.2) = -1.5     no
    #   3      1.1  1    1.1                        no
    #   pad    3.0  5    (would be 6.0, active)     -
    # J = (2.4 - 1.6 - 1.5 + 1.1) / 4 = 0.1, loss = -0.1; clip_frac = 2 / 4 real tokens = 0.5
    rho = torch.tensor([[1.5, 0.5, 1.5, 1.1, 3.0]])
    adv = torch.tensor([[2.0, -2.0, -1.0, 1.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    logp = torch.log(rho)
    old = torch.zeros_like(logp)
    loss, stats = grpo_loss(logp, old, ref_logp=logp, advantages=adv, mask=mask, settings=LossSettings(0.2, 0.0))
    assert loss.item() == pytest.approx(-0.1, abs=1e-6)
    assert stats["clip_frac"].item() == pytest.approx(0.5)
    assert stats["kl"].item() == pytest.approx(0.0, abs=1e-7)


def test_grpo_loss_when_the_clip_does_not_bind():
    # rho 1.1 with A 1 -> 1.1; rho 0.9 with A -1 -> -0.9; both inside [0.8, 1.2]
    # J = (1.1 - 0.9) / 2 = 0.1, loss = -0.1, clip_frac 0
    logp = torch.log(torch.tensor([[1.1, 0.9]]))
    loss, stats = grpo_loss(
        logp,
        torch.zeros_like(logp),
        logp,
        torch.tensor([[1.0, -1.0]]),
        torch.ones(1, 2),
        settings=LossSettings(0.2, 0.0),
    )
    assert loss.item() == pytest.approx(-0.1, abs=1e-6)
    assert stats["clip_frac"].item() == 0.0


def test_grpo_loss_aggregates_per_output_and_ignores_padding():
    # Two outputs, T = 5: o1 has 2 real tokens, o2 has 4. rho = 1 on real tokens, beta = 0.1.
    # o1: A = 1, 1; log(pi_ref/pi_theta) = ln 2, 0 -> KL = 1 - ln 2 = .30685, 0
    #     per token 1 - .1 * .30685 = .969315, 1.0 -> mean over |o1| = 2: .9846575
    # o2: A = -.5 x4; log-ratio 0, ln .5, 0, 0 -> KL = 0, ln 2 - .5 = .19315, 0, 0
    #     per token -.5, -.519315, -.5, -.5 -> mean over |o2| = 4: -.50482875
    # J = (.9846575 - .50482875) / 2 = .23991437, loss = -.23991437
    # (token-level aggregation would give -.05 / 6 = -.00833: the 1/|o_i| form is checked)
    # KL stat: token mean (.30685 + .19315) / 6 = .5 / 6
    # Padding holds garbage (rho e^10, A 100, log-ratio -55) that would change everything if counted.
    beta = 0.1
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0, 0.0]])
    logp = torch.tensor([[-1.0, -2.0, 5.0, 5.0, 5.0], [-0.5, -1.5, -2.5, -3.5, 5.0]])
    old = torch.tensor([[-1.0, -2.0, -5.0, -5.0, -5.0], [-0.5, -1.5, -2.5, -3.5, -5.0]])
    ref = logp + torch.tensor([[LN2, 0.0, -60.0, -60.0, -60.0], [0.0, -LN2, 0.0, 0.0, -60.0]])
    adv = torch.tensor([[1.0, 1.0, 100.0, 100.0, 100.0], [-0.5, -0.5, -0.5, -0.5, 100.0]])
    loss, stats = grpo_loss(logp, old, ref, adv, mask, settings=LossSettings(0.2, beta))
    o1 = ((1 - beta * (1 - LN2)) + 1.0) / 2
    o2 = (-0.5 * 4 - beta * (LN2 - 0.5)) / 4
    assert o1 == pytest.approx(0.9846575, abs=1e-6) and o2 == pytest.approx(-0.50482875, abs=1e-6)
    assert loss.item() == pytest.approx(-(o1 + o2) / 2, abs=1e-6)
    assert loss.item() == pytest.approx(-0.23991437, abs=1e-6)
    assert stats["kl"].item() == pytest.approx(0.5 / 6, abs=1e-6)
    assert stats["clip_frac"].item() == 0.0


def test_masked_mean_per_output():
    # (1 + 2) / 2 = 1.5 ; (4 + 5 + 6) / 3 = 5 ; no real tokens -> 0
    values = torch.tensor([[1.0, 2.0, 99.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    close(masked_mean_per_output(values, mask), [1.5, 5.0, 0.0])


def test_grpo_loss_gradient_with_mu_1():
    # mu = 1: old = ref = logp.detach(), so rho = 1 and the KL term and its gradient are 0.
    # loss = -(1/N) sum_i (1/|o_i|) sum_t A[i,t] exp(logp - old)  ->  d loss / d logp[i,t] = -A[i,t] / |o_i| / N
    # N = 3, lengths 4, 2, 3; padding gets gradient 0.
    gen = torch.Generator().manual_seed(0)
    logp = (-3 * torch.rand(3, 4, generator=gen)).requires_grad_(True)
    adv = torch.tensor([[1.5, 1.5, -0.5, 0.25], [-1.0, 2.0, 7.0, 7.0], [0.3, 0.3, 0.3, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    loss, stats = grpo_loss(logp, logp.detach(), logp.detach(), adv, mask, settings=LossSettings(0.2, 0.04))
    loss.backward()
    lengths = torch.tensor([[4.0], [2.0], [3.0]])
    close(logp.grad, -adv * mask / lengths / 3, tol=1e-7)
    # value: -(mean(1.5, 1.5, -.5, .25) + mean(-1, 2) + mean(.3, .3, .3)) / 3 = -(.6875 + .5 + .3) / 3
    assert loss.item() == pytest.approx(-(0.6875 + 0.5 + 0.3) / 3, abs=1e-6)
    assert stats["kl"].item() == 0.0 and stats["clip_frac"].item() == 0.0
