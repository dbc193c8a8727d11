"""outputs.logits_to_logprobs (the chunked SelectedLogSoftmax) against log_softmax over the whole vocabulary:
the same log-probabilities, entropies and gradients, at any temperature and for bf16 logits."""

import pytest
import torch
import torch.nn.functional as F

from grpo_engine.rollout.outputs import LOGPROB_CHUNK, logits_to_logprobs


def reference(logits, tokens, temperature):
    logp_all = F.log_softmax(logits.float() / temperature, dim=-1)
    return logp_all.gather(-1, tokens.unsqueeze(-1)).squeeze(-1), -(logp_all.exp() * logp_all).sum(-1)


def test_the_worked_example():
    logp, ent = logits_to_logprobs(torch.tensor([[[2.0, 0.0]]]), torch.tensor([[0]]), temperature=2.0)
    assert logp.item() == pytest.approx(-0.3133, abs=1e-4) and ent.item() == pytest.approx(0.5822, abs=1e-4)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("length", [1, LOGPROB_CHUNK, 2 * LOGPROB_CHUNK + 3])
def test_values_and_gradients_match_the_whole_log_softmax(temperature, length):
    torch.manual_seed(length)
    logits = (3 * torch.randn(3, length, 50)).requires_grad_()
    tokens = torch.randint(0, 50, (3, length))
    weights = torch.randn(3, length)
    logp, ent = logits_to_logprobs(logits, tokens, temperature)
    (grad,) = torch.autograd.grad((logp * weights).sum(), logits)
    want_logp, want_ent = reference(logits, tokens, temperature)
    (want_grad,) = torch.autograd.grad((want_logp * weights).sum(), logits)
    torch.testing.assert_close(logp, want_logp)
    torch.testing.assert_close(ent, want_ent)
    torch.testing.assert_close(grad, want_grad)
    assert not ent.requires_grad


def test_bf16_logits_get_a_bf16_gradient_and_fp32_log_probs():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 40).to(torch.bfloat16).requires_grad_()
    tokens = torch.randint(0, 40, (2, 5))
    logp, _ = logits_to_logprobs(logits, tokens, 1.0, entropy=False)
    assert logp.dtype == torch.float32
    logp.sum().backward()
    assert logits.grad.dtype == torch.bfloat16
    want, _ = reference(logits.detach().float().requires_grad_(), tokens, 1.0)
    torch.testing.assert_close(logp, want)
