"""The GRPO variants practitioners know from TRL and verl (loss_type, scale_rewards, clip_eps_high, ratio_level) on
hand-computed numbers (docs/algorithm.md, Variants), their refusals, and short real runs with each choice."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_engine.algo.objective import (
    ADV_EPS,
    LossSettings,
    advantage_divisor,
    aggregate,
    clipped_surrogate,
    grpo_loss,
    loss_denominator,
    outcome_advantages,
    process_advantages,
    sequence_ratio,
)
from grpo_engine.spec.config import SpecError, validate_spec


def close(actual: torch.Tensor, expected, tol: float = 1e-5) -> None:
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert torch.allclose(actual, expected, atol=tol, rtol=0), f"\n{actual}\n!=\n{expected}"


# --- scale_rewards: what advantages are divided by ---------------------------------------------


def test_advantage_divisor_for_each_scale():
    std = torch.tensor([[0.5], [0.25]])
    close(advantage_divisor("group", std, None), [[0.5 + ADV_EPS], [0.25 + ADV_EPS]])
    close(advantage_divisor("batch", std, 0.4), 0.4 + ADV_EPS)
    assert advantage_divisor("none", std, None) == 1.0


REWARDS = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]])


def test_outcome_batch_scale_divides_by_the_std_of_every_reward_of_the_batch():
    # 8 rewards, 3 ones: mean 3/8 = .375, population variance .375 * .625 = .234375, std .48412
    # group means stay each group's: .25 and .5 -> deviations .75, -.25 (x3) and .5, .5, -.5, -.5
    std = math.sqrt(0.234375)
    assert std == pytest.approx(0.48412, abs=1e-5)
    d = std + ADV_EPS
    adv = outcome_advantages(REWARDS, scale="batch")
    close(adv, [[0.75 / d] + [-0.25 / d] * 3, [0.5 / d] * 2 + [-0.5 / d] * 2])
    close(adv, [[1.5489, -0.5163, -0.5163, -0.5163], [1.0326, 1.0326, -1.0326, -1.0326]], tol=1e-4)
    # with several processes the std is that of every process's rewards, passed in
    close(
        outcome_advantages(REWARDS, scale="batch", batch_std=0.5),
        [[0.75 / 0.5001] + [-0.25 / 0.5001] * 3, [0.5 / 0.5001] * 2 + [-0.5 / 0.5001] * 2],
    )


def test_outcome_no_scale_is_the_reward_minus_the_group_mean():
    close(outcome_advantages(REWARDS, scale="none"), [[0.75, -0.25, -0.25, -0.25], [0.5, 0.5, -0.5, -0.5]], tol=1e-7)
    # the seed's example: rewards (0, 1, 0), mean 1/3
    close(outcome_advantages(torch.tensor([[0.0, 1.0, 0.0]]), scale="none"), [[-1 / 3, 2 / 3, -1 / 3]], tol=1e-7)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_an_all_equal_group_gets_exactly_zero_whatever_the_scale(scale):
    # float32's mean of four 0.1 is not exactly 0.1: the zeros come from the equality test, not the arithmetic
    adv = outcome_advantages(torch.tensor([[0.1, 0.1, 0.1, 0.1], [0.0, 1.0, 0.0, 1.0]]), scale=scale)
    assert torch.equal(adv[0], torch.zeros(4)), adv
    assert (adv[1] != 0).all()


def test_process_batch_and_no_scale():
    # the seed's group: R = {1, 1, 0, 1}, mean .75 (the group's whatever the scale)
    # batch, std of every step reward of the batch .5: 1 -> .25 / .5001 = .4999, 0 -> -.75 / .5001 = -1.4997
    #   o1 (steps end at 10, 19; rewards 1, 1): t <= 10 -> .9998, 11..19 -> .4999, then 0
    #   o2 (steps end at 9, 18; rewards 0, 1): t <= 9 -> -.9998, 10..18 -> .4999, then 0
    # none: 1 -> .25, 0 -> -.75: o1 .5 / .25, o2 -.5 / .25
    rewards, ends = [[1.0, 1.0], [0.0, 1.0]], [[10, 19], [9, 18]]
    good, bad = 0.25 / 0.5001, -0.75 / 0.5001
    adv = process_advantages(rewards, ends, 24, scale="batch", batch_std=0.5)
    close(adv[0], [2 * good] * 11 + [good] * 9 + [0.0] * 4)
    close(adv[1], [bad + good] * 10 + [good] * 9 + [0.0] * 5)
    assert adv[0, 0].item() == pytest.approx(0.9998, abs=1e-4) and adv[1, 0].item() == pytest.approx(-0.9998, abs=1e-4)
    adv = process_advantages(rewards, ends, 24, scale="none")
    close(adv[0], [0.5] * 11 + [0.25] * 9 + [0.0] * 4, tol=1e-7)
    close(adv[1], [-0.5] * 10 + [0.25] * 9 + [0.0] * 5, tol=1e-7)
    # all-equal step rewards still give exactly zero
    assert torch.equal(
        process_advantages([[0.1, 0.1], [0.1]], [[1, 3], [2]], 5, scale="batch", batch_std=0.3), torch.zeros(2, 5)
    )


# --- clip_eps_high: DAPO's clip-higher ---------------------------------------------------------


def test_clip_eps_high_binds_only_above():
    # eps .2, eps_high .28: the ratio is clipped to [.8, 1.28]
    #   rho 1.25, A  2: min(2.5, 2.5) = 2.5      not active  (symmetric .2: min(2.5, 2.4) = 2.4, active)
    #   rho 1.5,  A  2: min(3.0, 2.56) = 2.56    active      (symmetric: 2.4)
    #   rho 0.5,  A -2: min(-1.0, -1.6) = -1.6   active      (same as symmetric)
    #   rho 0.75, A -2: min(-1.5, -1.6) = -1.6   active      (same)
    #   rho 1.25, A -2: min(-2.5, -2.5) = -2.5   not active  (same)
    rho = torch.tensor([[1.25, 1.5, 0.5, 0.75, 1.25]])
    adv = torch.tensor([[2.0, 2.0, -2.0, -2.0, -2.0]])
    logp, old = torch.log(rho), torch.zeros(1, 5)
    high, high_active = clipped_surrogate(logp, old, adv, 0.2, clip_eps_high=0.28)
    close(high, [[2.5, 2.56, -1.6, -1.6, -2.5]])
    assert high_active.tolist() == [[0.0, 1.0, 1.0, 1.0, 0.0]]
    sym, sym_active = clipped_surrogate(logp, old, adv, 0.2)  # clip_eps_high 0: eps
    close(sym, [[2.4, 2.4, -1.6, -1.6, -2.5]])
    assert sym_active.tolist() == [[1.0, 1.0, 1.0, 1.0, 0.0]]
    assert torch.equal(high[:, 2:], sym[:, 2:])  # below 1 nothing changes
    same, _ = clipped_surrogate(logp, old, adv, 0.2, clip_eps_high=0.2)
    assert torch.equal(same, sym)


# --- ratio_level: GSPO's sequence ratio --------------------------------------------------------

# log-ratios logp - old_logp: o1 (.1, .3, -.1), o2 (.5, .1), o3 (-.4, -.2); padding holds a large one
LOG_RATIO = torch.tensor([[0.1, 0.3, -0.1, 5.0], [0.5, 0.1, 5.0, 5.0], [-0.4, -0.2, 5.0, 5.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
S = [math.exp(0.1), math.exp(0.3), math.exp(-0.3)]  # mean log-ratios .1, .3, -.3: 1.10517, 1.34986, .74082


def test_sequence_ratio_value_and_gradient():
    logp = (torch.full((3, 4), -1.0) + LOG_RATIO).requires_grad_(True)
    old = torch.full((3, 4), -1.0)
    ratio = sequence_ratio(logp, old, MASK)
    close(ratio, [[S[0]] * 4, [S[1]] * 4, [S[2]] * 4])  # s_i on every token
    close(ratio[:, 0], [1.10517, 1.34986, 0.74082], tol=1e-5)
    weights = torch.arange(12.0).view(3, 4)
    (ratio * weights).sum().backward()
    # d ratio[i,t] / d logp[i,t] = s_i, and nothing flows between tokens
    close(logp.grad, torch.tensor(S).view(3, 1) * weights)


def test_sequence_level_clips_each_output_as_a_whole():
    # eps .2, eps_high .28, A +1 for o1 and o2, -1 for o3, beta 0:
    #   o1: s 1.10517 inside [.8, 1.28]        -> 1.10517 on its 3 tokens, not clipped
    #   o2: s 1.34986 > 1.28 with A > 0        -> 1.28 on its 2 tokens, clipped
    #   o3: s .74082 < .8 with A < 0           -> min(-.74082, -.8) = -.8 on its 2 tokens, clipped
    # J (grpo) = (1.10517 + 1.28 - .8) / 3 = .52839; clip_frac = (2 + 2) / 7 tokens
    adv = torch.tensor([[1.0] * 4, [1.0] * 4, [-1.0] * 4])
    logp = (torch.full((3, 4), -1.0) + LOG_RATIO).requires_grad_(True)
    old = torch.full((3, 4), -1.0)
    loss, stats = grpo_loss(logp, old, logp.detach(), adv, MASK, settings=LossSettings(0.2, 0.0, 0.28, "sequence"))
    assert loss.item() == pytest.approx(-(S[0] + 1.28 - 0.8) / 3, abs=1e-6)
    assert loss.item() == pytest.approx(-0.52839, abs=1e-5)
    assert stats["clip_frac"].item() == pytest.approx(4 / 7)
    loss.backward()
    # only o1 is inside the clip: d loss / d logp[0,t] = -(1/3 outputs) (1/3 tokens) s_1 A_1 = -.12280
    close(logp.grad, [[-S[0] / 9] * 3 + [0.0], [0.0] * 4, [0.0] * 4])
    _, token_stats = grpo_loss(logp.detach(), old, logp.detach(), adv, MASK, settings=LossSettings(0.2, 0.0, 0.28))
    # token level clips single tokens: o1's second (e^.3 = 1.3499) inside an unclipped output, o2's first
    # (1.6487) and o3's first (e^-.4 = .6703, A < 0); o3's second (e^-.2 = .8187) is inside
    assert token_stats["clip_frac"].item() == pytest.approx(3 / 7)


def test_sequence_level_equals_token_level_when_every_token_has_the_same_log_ratio():
    gen = torch.Generator().manual_seed(0)
    base = -3 * torch.rand(3, 4, generator=gen)
    old = base - torch.tensor([[0.3], [-0.1], [0.25]])  # one log-ratio per output, different between outputs
    adv = torch.randn(3, 4, generator=gen)  # per-token advantages, as process supervision gives
    ref = base + 0.2 * torch.randn(3, 4, generator=gen)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    results = []
    for level in ("token", "sequence"):
        logp = base.clone().requires_grad_(True)
        loss, stats = grpo_loss(logp, old, ref, adv, mask, settings=LossSettings(0.2, 0.04, 0.28, level))
        loss.backward()
        results.append((loss.item(), stats["clip_frac"].item(), logp.grad))
    (l1, c1, g1), (l2, c2, g2) = results
    assert l1 == pytest.approx(l2, abs=1e-6) and c1 == c2
    close(g1, g2, tol=1e-6)


# --- loss_type: how per-token terms are aggregated ---------------------------------------------

# per-token terms: o1 (2, 4, 6) and a padding token, o2 (1, 3) and two padding tokens
VALUES = torch.tensor([[2.0, 4.0, 6.0, 99.0], [1.0, 3.0, 99.0, 99.0]])
VMASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    "loss_type,denominator,expected",
    [
        ("grpo", 2, 3.0),  # token means 12/3 = 4 and 4/2 = 2; their mean over N = 2 outputs: 3
        ("bnpo", 5, 3.2),  # token sum 12 + 4 = 16 over 5 real tokens
        ("dapo", 5, 3.2),  # the same with one process
        ("dr_grpo", 8, 2.0),  # 16 / (N = 2 x max_new_tokens = 4)
    ],
)
def test_aggregations_on_hand_numbers(loss_type, denominator, expected):
    assert loss_denominator(loss_type, 2, 5.0, all_tokens=5.0, processes=1, max_new_tokens=4) == denominator
    assert aggregate(VALUES, VMASK, loss_type, denominator).item() == pytest.approx(expected)
    # grpo_loss on the same terms: rho = 1 (old = logp) and beta = 0 make each token's term its advantage;
    # without a denominator the call is the whole batch and T = 4 stands for max_new_tokens
    logp = torch.zeros(2, 4)
    loss, _ = grpo_loss(logp, logp, logp, VALUES, VMASK, settings=LossSettings(0.2, 0.0, loss_type=loss_type))
    assert loss.item() == pytest.approx(-expected)


def test_each_process_denominator_averages_to_the_whole_batch():
    # process A holds o1, o2 above (2 outputs, 5 tokens, token sum 16, token means 4 and 2);
    # process B holds o3 (5, 5, 5, 5) and o4 (0, 6, 0, pad): 7 tokens, sum 26, token means 5 and 2. 12 tokens in all.
    # the data-parallel gradient average is the mean of the two processes' losses:
    #   grpo    (4 + 2 + 5 + 2) / 4 outputs = 3.25           A 6/2 = 3,    B 7/2 = 3.5
    #   dapo    42 / 12 tokens = 3.5                         A 16/6,       B 26/6
    #   dr_grpo 42 / (4 outputs x 4) = 2.625                 A 16/8 = 2,   B 26/8 = 3.25
    #   bnpo    each process's token mean, averaged: (16/5 + 26/7) / 2 = 3.4571, not 3.5
    b_values = torch.tensor([[5.0, 5.0, 5.0, 5.0], [0.0, 6.0, 0.0, 99.0]])
    b_mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    expected = {"grpo": 3.25, "dapo": 3.5, "dr_grpo": 2.625, "bnpo": (16 / 5 + 26 / 7) / 2}
    assert (
        loss_denominator("dapo", 2, 5.0, all_tokens=12.0, processes=2, max_new_tokens=4) == 6.0
        and loss_denominator("bnpo", 2, 7.0, all_tokens=12.0, processes=2, max_new_tokens=4) == 7.0
    )
    for loss_type, want in expected.items():
        parts = [
            aggregate(
                v,
                m,
                loss_type,
                loss_denominator(loss_type, 2, m.sum().item(), all_tokens=12.0, processes=2, max_new_tokens=4),
            ).item()
            for v, m in ((VALUES, VMASK), (b_values, b_mask))
        ]
        assert sum(parts) / 2 == pytest.approx(want), loss_type
    assert expected["bnpo"] == pytest.approx(3.4571, abs=1e-4)


class LinearPolicy(torch.nn.Module):
    """A tiny "policy": each position's features times one weight matrix give the next token's logits."""

    def __init__(self, features: torch.Tensor, vocab: int):
        super().__init__()
        self.features = features  # (N, T, D)
        self.weight = torch.nn.Parameter(
            0.3 * torch.randn(features.shape[-1], vocab, generator=torch.Generator().manual_seed(1))
        )

    def logprobs(self, rows: slice, tokens: torch.Tensor) -> torch.Tensor:
        logits = self.features[rows] @ self.weight  # (n, T, V)
        return torch.log_softmax(logits, dim=-1).gather(-1, tokens[rows].unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dapo", "dr_grpo"])
def test_micro_batches_give_exactly_the_whole_batch_gradient(loss_type, ratio_level):
    """N = 3 outputs of unequal lengths, in micro-batches of 2 and 1, each divided by the whole batch's denominator:
    the accumulated gradient is the one of the whole batch at once (as step.update accumulates it)."""
    gen = torch.Generator().manual_seed(0)
    N, T, D, V = 3, 4, 5, 6
    policy = LinearPolicy(torch.randn(N, T, D, generator=gen), V)
    tokens = torch.randint(0, V, (N, T), generator=gen)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
    with torch.no_grad():
        base = policy.logprobs(slice(0, N), tokens)
    old = base + 0.2 * torch.randn(N, T, generator=gen)  # mu > 1: pi_old differs, so the clip binds somewhere
    ref = base + 0.2 * torch.randn(N, T, generator=gen)
    adv = torch.randn(N, T, generator=gen) * mask
    denominator = loss_denominator(
        loss_type, N, mask.sum().item(), all_tokens=mask.sum().item(), processes=1, max_new_tokens=T
    )

    def gradient(chunks):
        policy.zero_grad()
        total = 0.0
        for c in chunks:
            loss, _ = grpo_loss(
                policy.logprobs(c, tokens),
                old[c],
                ref[c],
                adv[c],
                mask[c],
                settings=LossSettings(0.2, 0.04, 0.28, ratio_level, loss_type),
                denominator=denominator,
            )
            loss.backward()
            total += loss.item()
        return total, policy.weight.grad.clone()

    whole_loss, whole = gradient([slice(0, 3)])
    micro_loss, micro = gradient([slice(0, 2), slice(2, 3)])
    assert micro_loss == pytest.approx(whole_loss, abs=1e-6)
    close(micro, whole, tol=1e-6)
    assert whole.abs().sum() > 0


# --- the run spec ----------------------------------------------------------------------------


@pytest.mark.parametrize("scale", ["group", "batch"])
def test_dr_grpo_without_scale_none_is_refused_on_scale_rewards(scale):
    with pytest.raises(SpecError) as info:
        validate_spec({"loss_type": "dr_grpo", "scale_rewards": scale})
    assert info.value.key == "scale_rewards"
    message = str(info.value)
    assert message.startswith("scale_rewards: must be 'none' with loss_type 'dr_grpo'") and repr(scale) in message
    spec = validate_spec({"loss_type": "dr_grpo", "scale_rewards": "none"})
    assert (spec.loss_type, spec.scale_rewards) == ("dr_grpo", "none")


@pytest.mark.parametrize(
    "spec,key,words",
    [
        ({"clip_eps_high": -0.1}, "clip_eps_high", "at least 0"),
        ({"clip_eps_high": 1.5}, "clip_eps_high", "at most 1"),
        ({"loss_type": "token-mean"}, "loss_type", "must be one of 'grpo', 'bnpo', 'dapo', 'dr_grpo'"),
        ({"scale_rewards": "std"}, "scale_rewards", "must be one of 'group', 'batch', 'none'"),
        ({"ratio_level": "seq"}, "ratio_level", "must be one of 'token', 'sequence'"),
    ],
)
def test_bad_values_are_refused_naming_the_key(spec, key, words):
    with pytest.raises(SpecError) as info:
        validate_spec(spec)
    assert info.value.key == key and words in str(info.value)


def test_the_defaults_are_the_paper_and_clip_eps_high_zero_means_clip_eps():
    spec = validate_spec({})
    assert (spec.loss_type, spec.scale_rewards, spec.ratio_level, spec.clip_eps_high) == ("grpo", "group", "token", 0.0)
    assert LossSettings() == LossSettings(spec.clip_eps, spec.kl_coef, 0.0, spec.ratio_level, spec.loss_type)
    rho, adv = torch.tensor([[1.5]]), torch.tensor([[2.0]])
    surrogate, _ = clipped_surrogate(
        torch.log(rho), torch.zeros(1, 1), adv, spec.clip_eps, clip_eps_high=spec.clip_eps_high
    )
    assert surrogate.item() == pytest.approx(1.2 * 2.0)  # clipped at 1 + clip_eps


# --- short real runs, one per new choice -----------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [
        {"loss_type": "bnpo"},
        {"loss_type": "dapo"},
        {"loss_type": "dr_grpo", "scale_rewards": "none"},
        {"scale_rewards": "batch"},
        {"scale_rewards": "none"},
        {"scale_rewards": "batch", "supervision": "process"},
        {"clip_eps_high": 0.28, "policy_updates_per_batch": 2},
        {"ratio_level": "sequence", "policy_updates_per_batch": 2},
        {"decode": "static", "micro_batch_size": 3},
    ],
    ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()),
)
def test_a_run_with_each_choice_completes(grpo_cache_dir, overrides):
    from grpo_engine.report.recorder import MemoryRecorder
    from grpo_engine.train.trainer import train

    rec = MemoryRecorder()
    spec = validate_spec(
        {"steps_per_iteration": 2, "batch_size": 2, "group_size": 4, "max_new_tokens": 16, "eval_every": 0, **overrides}
    )
    result = train(spec, rec, grpo_cache_dir, device="cpu")
    assert result.status == "completed" and [m["step"] for m in rec.metrics] == [1, 2]
    assert all(math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"]) for m in rec.metrics)
    if spec.supervision == "process":
        return
    for groups in rec.group_log.values():  # the advantages recorded are the scale's
        every = torch.tensor([s.reward for g in groups for s in g.samples])
        for g in groups:
            rewards = torch.tensor([s.reward for s in g.samples])
            expected = outcome_advantages(
                rewards.view(1, -1), scale=spec.scale_rewards, batch_std=every.std(unbiased=False).item()
            )[0]
            for s, a in zip(g.samples, expected.tolist(), strict=True):
                assert s.advantages == pytest.approx([a] * len(s.tokens), abs=1e-5)
