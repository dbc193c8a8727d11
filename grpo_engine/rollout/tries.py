"""A question tried by hand: G outputs of one model to one question, sampled as the run samples (its prompt keys,
temperature and top_p) and read as its verifier reads them, each with its tokens' log-probs.

The dashboard's "Try a question" (app.service.tries) asks a worker for this (workers/tries.py), once per model tried:
the run's starting model, one of its kept checkpoints or its trained policy, each a model directory by then.

Each output is scored as an outcome: the verifier's reward under the run's ``answer_match`` and ``format_reward``,
or, where the run names ``rewards``, their weighted sum with every component. A learned reward model's score and
step rewards are not computed here: they need the run's reward model or its rollouts.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from grpo_engine.rewards.reward_functions import RewardFunctionError, named_rewards
from grpo_engine.rollout.outputs import encode_prompts, judge, token_logprobs
from grpo_engine.rollout.sampling import generate
from grpo_engine.rollout.tokenization import completion_mask, end_token_ids, run_prompt


@torch.no_grad()
def try_outputs(
    policy, tokenizer, spec, question: str, reference: str, *, g: int, max_new_tokens: int, seed: int, deadline=None
):
    """``g`` outputs of ``policy`` to ``question`` under the run spec ``spec``, sampled from a random stream seeded
    with ``seed`` (the caller's stream untouched), each a dict: ``completion``, ``tokens`` (each token's text in
    context, the end token last where it ended), ``token_ids`` (theirs), ``logprobs`` (log pi of each token at the run's temperature, the
    end token's included), ``ended`` (False: cut at ``max_new_tokens``), ``answer`` and ``answer_rule`` (the
    verifier's reading), ``reward`` and ``components`` (with ``reference`` "": ``correct`` is None, not judged).
    ``deadline``: a ``time.monotonic()`` reading; sampling past it stops with TimeoutError."""
    policy.eval()
    device = next(policy.parameters()).device
    prompts = encode_prompts(tokenizer, [question], device, run_prompt(tokenizer, spec))
    ends = end_token_ids(policy, tokenizer)
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        how = {"greedy": False, "temperature": spec.temperature, "top_p": spec.top_p, "end_ids": ends}
        how["deadline"] = deadline
        completions = generate(policy, tokenizer, prompts, repeat=g, max_new_tokens=max_new_tokens, **how)  # (G, T)
    mask, ended = completion_mask(completions, ends)  # (G, T), (G,)
    ids, attn = (prompts[k].repeat_interleave(g, dim=0) for k in ("input_ids", "attention_mask"))  # (G, P)
    logp, _ = token_logprobs(policy, ids, attn, completions, mask, temperature=spec.temperature, entropy=False)
    rows = [{"question": question, "answer": reference}] * g
    judged = judge(tokenizer, completions, mask, ended, rows, process=False, format_weight=spec.format_reward,
                   match=spec.answer_match)  # fmt: skip
    lengths = mask.sum(dim=1).long().tolist()
    scores, error = judged.outcome, None
    if spec.rewards:
        try:  # each output as an outcome, whatever the run's supervision
            scores = named_rewards(replace(spec, supervision="outcome"), judged, rows, lengths)[0]
        except RewardFunctionError as exc:
            error = str(exc)
    return [
        {
            "completion": judged.texts[i],
            "tokens": judged.tokens[i],
            "token_ids": completions[i, : lengths[i]].tolist(),
            "logprobs": [round(v, 4) for v in logp[i, : lengths[i]].tolist()],
            "ended": bool(ended[i]),
            "answer": judged.readings[i][0],
            "answer_rule": judged.readings[i][1],
            "reward": None if error else float(scores[i][0]),
            "components": _judged_only(scores[i][1], reference),
            "reward_error": error,
        }
        for i in range(g)
    ]


def _judged_only(components: dict, reference: str) -> dict:
    """The components as shown: without a reference the verdict says nothing (``correct`` None)."""
    shown = {k: float(v) for k, v in components.items()}
    if not reference.strip():
        shown["correct"] = None
    return shown
