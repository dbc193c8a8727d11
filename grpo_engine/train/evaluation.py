"""The held-out evaluation: greedy outputs to the held-out questions (``evaluate``), scored under both answer rules
with the share stating an answer in the strict form (``eval_scores``: EVAL_METRICS), and its log line
(``eval_summary``); ``heldout_metrics`` runs it on each process's share of the questions and adds their counts.

With ``eval_samples`` K > 0, ``sampled_sums`` also samples K outputs per question at ``eval_temperature`` and scores
them as pass@k and maj@k (grpo_engine.rewards.sampled_eval). Its sampling draws from a random stream of its own,
seeded by the run's seed and the step (``eval_seed``), so a sampled evaluation leaves the training's stream as it was:
the same spec trains the same steps with or without it, and a resumed run evaluates as the straight one did.
"""

from __future__ import annotations

import torch

from grpo_engine.report.metrics import EVAL_METRICS
from grpo_engine.rewards.rewards import outcome_reward
from grpo_engine.rewards.sampled_eval import read_outputs, sampled_sums
from grpo_engine.rollout.outputs import completion_texts, encode_prompts
from grpo_engine.rollout.sampling import generate
from grpo_engine.rollout.tokenization import completion_mask, end_token_ids
from grpo_engine.train.learner import Learner

EVAL_BATCH = 256


@torch.no_grad()
def evaluate(
    policy, tokenizer, prompt, examples: list[dict], *, max_new_tokens: int, device, match: str = "strict"
) -> dict[str, float]:
    """The held-out greedy evaluation of ``examples``: EVAL_METRICS as shares of them (eval_scores), the run's
    accuracy under ``match`` (RunSpec.answer_match)."""
    policy.eval()
    texts: list[str] = []
    for i in range(0, len(examples), EVAL_BATCH):
        chunk = examples[i : i + EVAL_BATCH]
        prompts = encode_prompts(tokenizer, [e["question"] for e in chunk], device, prompt)
        comps = generate(policy, tokenizer, prompts, repeat=1, max_new_tokens=max_new_tokens, greedy=True)
        texts += completion_texts(tokenizer, comps, *completion_mask(comps, end_token_ids(policy, tokenizer)))
    return eval_scores(texts, [e["answer"] for e in examples], match)


@torch.no_grad()
def sampled_evaluation(policy, tokenizer, prompt, examples: list[dict], *, spec, device, seed: int) -> dict[str, float]:
    """The sampled evaluation of ``examples``: ``spec.eval_samples`` outputs each at ``spec.eval_temperature``, drawn
    from a random stream seeded with ``seed`` (the caller's stream untouched); eval/pass@k and eval/maj@k summed over
    the questions (sampled_eval.sampled_sums)."""
    policy.eval()
    k, readings = spec.eval_samples, []
    per_chunk = max(1, EVAL_BATCH // k)  # questions per batch: at most EVAL_BATCH sampled rows at once
    devices = [device] if torch.device(device).type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        for i in range(0, len(examples), per_chunk):
            chunk = examples[i : i + per_chunk]
            prompts = encode_prompts(tokenizer, [e["question"] for e in chunk], device, prompt)
            comps = generate(
                policy,
                tokenizer,
                prompts,
                repeat=k,
                max_new_tokens=spec.max_new_tokens,
                greedy=False,
                temperature=spec.eval_temperature,
            )
            texts = completion_texts(tokenizer, comps, *completion_mask(comps, end_token_ids(policy, tokenizer)))
            for j, example in enumerate(chunk):
                readings.append(read_outputs(texts[j * k : (j + 1) * k], example["answer"], spec.answer_match))
    return sampled_sums(readings, k)


def eval_seed(seed: int, step: int, rank: int) -> int:
    """The seed of the sampled evaluation at ``step`` on process ``rank``: a stream of its own per run, step and
    process.

    >>> eval_seed(0, 0, 0), eval_seed(0, 10, 0), eval_seed(1, 0, 0), eval_seed(0, 0, 1)
    (1009003027, 1009013117, 2018006054, 1009003028)
    """
    return ((seed + 1) * 1_000_003 + step) * 1_009 + rank  # a process's rank is below 1,009


def heldout_metrics(learner: Learner, heldout: list[dict], step: int) -> dict[str, float]:
    """Every process calls it: the held-out evaluation's EVAL_METRICS for ``learner``'s policy at ``step`` and, with
    ``eval_samples``, its pass@k and maj@k. Each process evaluates every n-th question, and the shares are of all
    the held-out questions (each process's counts summed)."""
    procs, spec = learner.procs, learner.spec
    mine = heldout[procs.rank :: procs.n]
    with learner.gathered():
        policy = learner.unwrapped()
        shares = evaluate(
            policy,
            learner.tokenizer,
            learner.prompt,
            mine,
            max_new_tokens=spec.max_new_tokens,
            device=learner.dev,
            match=spec.answer_match,
        )
        sampled = {}
        if spec.eval_samples:
            seed = eval_seed(spec.seed, step, procs.rank)
            sampled = sampled_evaluation(
                policy, learner.tokenizer, learner.prompt, mine, spec=spec, device=learner.dev, seed=seed
            )
    counts = procs.sum([shares[k] * len(mine) for k in EVAL_METRICS])
    metrics = {k: c / max(1, len(heldout)) for k, c in zip(EVAL_METRICS, counts, strict=True)}
    sums = procs.sum(list(sampled.values()))
    return metrics | {k: total / max(1, len(heldout)) for k, total in zip(sampled, sums, strict=True)}


def eval_scores(texts: list[str], answers: list[str], match: str = "strict") -> dict[str, float]:
    """EVAL_METRICS of outputs ``texts`` to questions with reference ``answers``, each a share of the outputs:
    right under the strict rule, under the flexible one, under ``match`` (eval/accuracy), and stating a final
    answer in the strict form (eval/format). An output stating one has the same verdict under both rules. Each
    output is read as a step's verifier reads it (rewards.outcome_reward, whose reading the groups record).

    >>> from grpo_engine.report.metrics import EVAL_METRICS
    >>> scores = eval_scores(["3 + 5 = 8 apples.", "#### 14", "#### 9", "no idea"], ["8", "14", "7", "3"], "flexible")
    >>> [scores[k] for k in EVAL_METRICS]
    [0.5, 0.25, 0.5, 0.5]
    """
    right = {"strict": 0.0, "flexible": 0.0}
    formatted = 0.0
    for text, answer in zip(texts, answers, strict=True):
        verdict = outcome_reward(text, answer)[1]
        right["strict"] += verdict["correct"]
        formatted += verdict["formatted"]
        if not verdict["formatted"]:  # no answer in the strict form: the flexible rule reads the last number
            verdict = outcome_reward(text, answer, match="flexible")[1]
        right["flexible"] += verdict["correct"]
    n = max(1, len(texts))
    return {
        "eval/accuracy": right[match] / n,
        "eval/accuracy_strict": right["strict"] / n,
        "eval/accuracy_flexible": right["flexible"] / n,
        "eval/format": formatted / n,
    }


def eval_summary(metrics: dict[str, float]) -> str:
    """An evaluation's numbers as the log line gives them.

    >>> eval_summary({"eval/accuracy": 0.5, "eval/accuracy_strict": 0.25, "eval/accuracy_flexible": 0.5,
    ...               "eval/format": 0.5})
    'eval/accuracy 0.500 (strict 0.250, flexible 0.500, format 0.500)'
    """
    line = (
        f"eval/accuracy {metrics['eval/accuracy']:.3f} (strict {metrics['eval/accuracy_strict']:.3f}, "
        f"flexible {metrics['eval/accuracy_flexible']:.3f}, format {metrics['eval/format']:.3f})"
    )
    ks = sorted(int(name.removeprefix("eval/pass@")) for name in metrics if name.startswith("eval/pass@"))
    if ks:  # the sampled evaluation's widest K
        line += (
            f", pass@{ks[-1]} {metrics[f'eval/pass@{ks[-1]}']:.3f}, maj@{ks[-1]} {metrics[f'eval/maj@{ks[-1]}']:.3f}"
        )
    return line
