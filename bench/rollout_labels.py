"""Do Math-Shepherd's rollout labels agree with the exact step checker on the built-in task?

Samples fresh outputs of the built-in policy (process supervision: each output cut into steps), labels every step
twice, by rollouts (the policy continues from the end of each step --rollouts times; hard estimation: right when
any continuation reaches the answer) and by the built-in task's exact checker, and prints the agreement with the
confusion counts and the labelling time.

    .venv/bin/python -m bench.rollout_labels --cache-dir /tmp/grpo-cache
    .venv/bin/python -m bench.rollout_labels --questions 256 --rollouts 4 --estimate hard

Target (the rollouts issue): at least 90% of steps agree at N = 4, hard. Exit status 0 when met.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.harness import pass_fail
from grpo_engine.data.builtin_task import STEP_DELIMITER
from grpo_engine.data.data import load_dataset
from grpo_engine.model.model import load_policy
from grpo_engine.rollout.outputs import encode_prompts, judge
from grpo_engine.rollout.rollout_labels import Continuing, StepOutputs, rollout_verdicts
from grpo_engine.rollout.sampling import generate
from grpo_engine.rollout.tokenization import completion_mask, end_token_ids, prompt_formatter


def labelled_steps(cache_dir: Path, questions: int, n: int, estimate: str, seed: int = 0):
    """(rollout labels, exact labels, seconds spent on rollouts) for one fresh output per built-in question."""
    torch.manual_seed(seed)
    policy, tokenizer = load_policy("builtin-arith", cache_dir, torch.device("cpu"), log=lambda m: None)
    policy.eval()
    rows = load_dataset("builtin-arith")[0][:questions]
    prompts = encode_prompts(tokenizer, [r["question"] for r in rows], "cpu", prompt_formatter(tokenizer, "auto"))
    end_ids = end_token_ids(policy, tokenizer)
    with torch.no_grad():
        completions = generate(policy, tokenizer, prompts, repeat=1, greedy=False, max_new_tokens=32, end_ids=end_ids)
    mask, ended = completion_mask(completions, end_ids)
    judged = judge(tokenizer, completions, mask, ended, rows, process=True, delimiter=STEP_DELIMITER, checker="builtin")
    started = time.time()
    outputs = StepOutputs.judged(prompts["input_ids"], prompts["attention_mask"], completions, judged, rows)
    how = Continuing(n, max_new_tokens=32, temperature=1.0, top_p=1.0, end_ids=end_ids)
    by_rollouts = rollout_verdicts(policy, tokenizer, outputs, how, estimate)
    return by_rollouts, judged.verdicts, time.time() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", help="built-in model cache (default: a new one, built first: minutes)")
    parser.add_argument("--questions", type=int, default=256)
    parser.add_argument("--rollouts", type=int, default=4)
    parser.add_argument("--estimate", choices=("hard", "soft"), default="hard")
    args = parser.parse_args()
    cache = Path(args.cache_dir or tempfile.mkdtemp(prefix="grpo-cache-"))
    rollouts, exact, seconds = labelled_steps(cache, args.questions, args.rollouts, args.estimate)
    pairs = [(r >= 0.5, e >= 0.5) for rs, es in zip(rollouts, exact, strict=True) for r, e in zip(rs, es, strict=True)]
    counts = {(r, e): sum(1 for p in pairs if p == (r, e)) for r in (True, False) for e in (True, False)}
    agree = (counts[True, True] + counts[False, False]) / max(len(pairs), 1)
    print(
        f"{args.questions} outputs, {len(pairs)} steps; rollouts N={args.rollouts} ({args.estimate}) in {seconds:.1f} s"
    )
    print(f"agreement with the exact checker: {agree:.3f}")
    print(
        f"  rollouts right, checker right: {counts[True, True]:5d}   rollouts right, checker wrong: {counts[True, False]:5d}"
    )
    print(
        f"  rollouts wrong, checker right: {counts[False, True]:5d}   rollouts wrong, checker wrong: {counts[False, False]:5d}"
    )
    return pass_fail(agree >= 0.90)


if __name__ == "__main__":
    sys.exit(main())
