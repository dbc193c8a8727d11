"""The held-out evaluation: greedy outputs to the held-out questions (``evaluate``), each read as the verifier reads
it (``eval_output``: every question's outputs are recorded), scored under both answer rules with the share stating
an answer in the strict form (``eval_scores``: EVAL_METRICS), and its log line (``eval_summary``);
``heldout_metrics`` runs it on each process's share of the questions and adds their counts.

With ``eval_samples`` K > 0, ``evaluate`` also samples K outputs per question at ``eval_temperature``, scored as
pass@k and maj@k (grpo_engine.rewards.sampled_eval). Its sampling draws from a random stream of its own,
seeded by the run's seed and the step (``eval_seed``), so a sampled evaluation leaves the training's stream as it was:
the same spec trains the same steps with or without it, and a resumed run evaluates as the straight one did.
"""

from __future__ import annotations

import torch

from grpo_engine.report.metrics import EVAL_METRICS
from grpo_engine.report.recorder import EvalOutput, EvalQuestion
from grpo_engine.rewards.rewards import final_answer, outcome_reward, reading_reward
from grpo_engine.rewards.sampled_eval import Reading, sampled_sums
from grpo_engine.rollout.outputs import completion_texts, encode_prompts, output_tokens
from grpo_engine.rollout.sampling import generate
from grpo_engine.rollout.tokenization import completion_mask, end_token_ids
from grpo_engine.train.learner import Learner

EVAL_BATCH = 256


def _decoded(policy, tokenizer, prompt, questions: list[str], *, repeat: int, max_new_tokens: int, device, **how):
    """Outputs to ``questions`` (``repeat`` each, in order), in batches of at most EVAL_BATCH rows: each one's
    decoded text and its tokens' texts in context, the end token's last where it ended (as the groups record them)."""
    texts: list[str] = []
    tokens: list[list[str]] = []
    per_batch = max(1, EVAL_BATCH // repeat)
    ends = end_token_ids(policy, tokenizer)
    for i in range(0, len(questions), per_batch):
        prompts = encode_prompts(tokenizer, questions[i : i + per_batch], device, prompt)
        comps = generate(policy, tokenizer, prompts, repeat=repeat, max_new_tokens=max_new_tokens, **how)
        mask, ended = completion_mask(comps, ends)
        texts += completion_texts(tokenizer, comps, mask, ended)
        tokens += output_tokens(tokenizer, comps, mask, ended)
    return texts, tokens


@torch.no_grad()
def evaluate(policy, tokenizer, prompt, examples: list[dict], *, spec, device, seed: int) -> list[EvalQuestion]:
    """The held-out evaluation of ``examples`` (``index`` their places in the held-out split): each one's greedy
    output and, with ``spec.eval_samples`` K, K outputs sampled at ``spec.eval_temperature`` from a random stream
    seeded with ``seed`` (the caller's stream untouched), each read under ``spec.answer_match``."""
    policy.eval()
    questions = [e["question"] for e in examples]
    length = {"max_new_tokens": spec.max_new_tokens, "device": device}
    greedy, greedy_tokens = _decoded(policy, tokenizer, prompt, questions, repeat=1, greedy=True, **length)
    k, sampled, sampled_tokens = spec.eval_samples, [], []
    if k:
        devices = [device] if torch.device(device).type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            how = {"greedy": False, "temperature": spec.eval_temperature}
            sampled, sampled_tokens = _decoded(policy, tokenizer, prompt, questions, repeat=k, **how, **length)
    return [
        EvalQuestion(
            index=e["index"],
            question=e["question"],
            reference=e["answer"],
            greedy=eval_output(greedy[j], e["answer"], spec.answer_match, greedy_tokens[j]),
            samples=[
                eval_output(sampled[i], e["answer"], spec.answer_match, sampled_tokens[i])
                for i in range(j * k, (j + 1) * k)
            ],
        )
        for j, e in enumerate(examples)
    ]


def eval_output(text: str, reference: str, match: str, tokens: list[str] | None = None) -> EvalOutput:
    """An output as the verifier reads it under ``match`` (rewards.final_answer, reading_reward), with its
    ``tokens``' texts.

    >>> eval_output("3 + 5 = 8 apples.", "8", "flexible")  # doctest: +NORMALIZE_WHITESPACE
    EvalOutput(completion='3 + 5 = 8 apples.', answer='8', answer_rule='number', correct=True, formatted=False,
               tokens=[])
    """
    answer, rule = final_answer(text, match)
    verdict = reading_reward((answer, rule), reference)[1]
    verdicts = {"correct": verdict["correct"] == 1.0, "formatted": verdict["formatted"] == 1.0}
    return EvalOutput(text, answer, rule, **verdicts, tokens=list(tokens or []))


def eval_seed(seed: int, step: int, rank: int) -> int:
    """The seed of the sampled evaluation at ``step`` on process ``rank``: a stream of its own per run, step and
    process.

    >>> eval_seed(0, 0, 0), eval_seed(0, 10, 0), eval_seed(1, 0, 0), eval_seed(0, 0, 1)
    (1009003027, 1009013117, 2018006054, 1009003028)
    """
    return ((seed + 1) * 1_000_003 + step) * 1_009 + rank  # a process's rank is below 1,009


def heldout_metrics(learner: Learner, heldout: list[dict], step: int) -> tuple[dict[str, float], list[EvalQuestion]]:
    """Every process calls it: the held-out evaluation at ``step`` of ``learner``'s policy, as metrics (EVAL_METRICS
    and, with ``eval_samples``, pass@k and maj@k) and every question's outputs, on every process. Each process
    evaluates every n-th question; the shares are of all the held-out questions (each process's counts summed)."""
    procs, spec = learner.procs, learner.spec
    mine = [{**e, "index": i} for i, e in enumerate(heldout)][procs.rank :: procs.n]
    with learner.gathered():
        seed = eval_seed(spec.seed, step, procs.rank)
        evaluated = evaluate(
            learner.unwrapped(), learner.tokenizer, learner.prompt, mine, spec=spec, device=learner.dev, seed=seed
        )
    shares = eval_scores([q.greedy.completion for q in evaluated], [e["answer"] for e in mine], spec.answer_match)
    counts = procs.sum([shares[k] * len(mine) for k in EVAL_METRICS])
    metrics = {k: c / max(1, len(heldout)) for k, c in zip(EVAL_METRICS, counts, strict=True)}
    if spec.eval_samples:
        readings = [[Reading(o.answer, o.correct) for o in q.samples] for q in evaluated]
        sampled = sampled_sums(readings, spec.eval_samples)
        sums = procs.sum(list(sampled.values()))
        metrics |= {k: total / max(1, len(heldout)) for k, total in zip(sampled, sums, strict=True)}
    return metrics, sorted(procs.gather(evaluated), key=lambda q: q.index)


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
