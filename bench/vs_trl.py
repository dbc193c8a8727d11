"""This engine against TRL's GRPOTrainer: same model, same settings, same questions, same verifier.

Configurations (--configs, comma-separated; --gpu adds qwen05b):

  builtin   the built-in tiny model (builtin-arith, ~0.58M parameters), fp32 on the CPU
  llama25m  a ~25.9M-parameter Llama (hidden 512, 8 layers, 8 heads, MLP 1376, tied embeddings) with
            random weights (seeded) and the built-in tokenizer, fp32 on the CPU
  qwen05b   a ~494M-parameter Qwen2 (Qwen2.5-0.5B's shape: hidden 896, 24 layers, 14 heads, 2 KV heads,
            MLP 4864, vocabulary 151936, tied embeddings) with random weights and the built-in tokenizer
            (whose 1201 ids are the first rows of that vocabulary), bf16 autocast on the GPU (weights
            and optimizer state fp32 on both sides: the engine's precision "bf16", TRL's bf16=True);
            bench/gpu_check.py runs it with ChatML's tokens and chat template added (<|im_end|> its EOS), both
            sides then training on the chat-formatted prompt

Both sides train on the built-in arithmetic questions (the same training split, the same prompt text
``question\\n``: the built-in tokenizer has no chat template and no BOS) with the engine's verifier as the
reward, and the same settings: B questions per step, G completions each (one optimizer step consumes
the B x G completions sampled for it, generated once), max new tokens, beta (k3 KL against a frozen
reference), epsilon, mu = 1, temperature, top-p and no top-k, learning rate (constant, AdamW, gradient
norm clipped to 1), and the paper's loss: each completion's token mean, then the mean over completions,
with advantages normalised by the std within each group. Variants:

  engine off  grpo_engine.trainer.train with a recorder that records nothing
  engine on   the same with the worker's DBRecorder on a fresh migrated SQLite store (as
              bench/recording_overhead.py does; builtin only): the dashboard's recording
  trl         trl.GRPOTrainer (options and why: see trl_trial)

Every trial runs in a fresh Python process (no memory or warm caches carried over), one at a time; the
trials alternate in rounds (--repeats), the order of the variants rotating each round, so that drift of a
shared machine falls on all of them. A step's time is wall clock from the end of the previous step (or of
the set-up) to the end of this one: everything the trainer does per step, its logging and recording
included. A trial runs --builtin-steps (60) steps on builtin, whose steps are short, else --steps (12);
its first --warmup (2) are left out. Rates pool all repeats: total completions (or completion tokens, EOS
included) over total time of the measured steps. Peak memory is that of training: on the CPU the
process's peak resident set (VmHWM, reset to the current RSS through /proc/self/clear_refs once the model,
reference, optimizer and data are set up, so Linux only; it counts every resident page, the modules each
side imports included), shown with the RSS at that point; on the GPU torch.cuda.max_memory_allocated from
the same point, with the bytes allocated at that point.

For the engine the report also splits the step into its phases (its time/sampling, time/scoring and
time/update metrics) and estimates its achieved FLOP/s (n = parameters, tokens = prompt + completion
tokens of the B x G sequences): update phase 6 n tokens / time/update (forward and backward of the
policy); the reference forward runs in the scoring phase, so with it 8 n tokens / (time/update +
time/scoring) (the scoring time also holds decoding and the verifier).

    .venv/bin/python bench/vs_trl.py --cache-dir /tmp/bc    # reuse a built-in model cached there
    .venv/bin/python bench/vs_trl.py                        # a fresh cache: builds the built-in model first (~2 min)
    .venv/bin/python bench/vs_trl.py --cache-dir /tmp/bc --configs builtin --repeats 1 --builtin-steps 12
    .venv/bin/python bench/vs_trl.py --cache-dir /tmp/bc --configs qwen05b --repeats 2             # on a GPU

Needs trl (``pip install trl``; written against trl 1.16). PASS lines: the engine's completions/s is at
least --min-ratio (1.5) x TRL's on each CPU configuration run, and recording adds at most --max-overhead
(5%) to the engine's mean step time on builtin. Exit status 0 when every check passes.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: recording_overhead's recorders
from recording_overhead import StepTimer, recorder_for  # noqa: E402  (torch-free)

RESULT = "VS_TRL_RESULT "  # a trial's stdout line with its JSON result (TRL prints its logs there too)
CPU_CONFIGS = ("builtin", "llama25m")
GPU_CONFIG = "qwen05b"
RECORDED = ("builtin",)  # configurations that also run the engine with recording on
ARCH = {
    "llama25m": ("LlamaConfig", dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=8,
                                     num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=2048)),
    "qwen05b": ("Qwen2Config", dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                    num_attention_heads=14, num_key_value_heads=2, vocab_size=151936)),
}
CHATML = dict(  # Qwen2 instruct models' chat format (as tests/tiny_models.py's qwen2)
    special=("<|im_start|>", "<|im_end|>"), eos="<|im_end|>",
    template=("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"))
PHASES = ("time/sampling", "time/scoring", "time/update")  # the engine's step phases, from its metrics
CONSISTENT = 1.2  # repeats of one variant whose rates differ by more than this factor: a busy machine
MB = 1e6


# ---- one trial, in its own process ------------------------------------------------------------------

def _status_bytes(field: str) -> int:
    """A memory field of /proc/self/status (kB there) in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


class TrainingMemory:
    """Peak memory from ``reset()`` (called once set-up is done, before the first step) to ``peak()``."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.before = 0  # bytes held at reset(): RSS on the CPU, allocated on the GPU

    def reset(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.before = torch.cuda.memory_allocated()
        else:
            Path("/proc/self/clear_refs").write_text("5")  # VmHWM := current RSS
            self.before = _status_bytes("VmRSS")

    def peak(self) -> int:
        if self.cuda:
            import torch

            return torch.cuda.max_memory_allocated()
        return _status_bytes("VmHWM")


def engine_trial(t: dict) -> dict:
    """grpo_engine.trainer.train on the trial's settings, recording into a fresh store (t["record"]) or nowhere."""
    from transformers import AutoTokenizer

    from grpo_engine.config import validate_spec
    from grpo_engine.data import load_dataset
    from grpo_engine.trainer import train

    cuda = t["device"] == "cuda"
    chat = t.get("chat", False)
    spec = validate_spec({
        "model": t["model_dir"], "dataset": "builtin-arith", "batch_size": t["batch_size"],
        "group_size": t["group_size"], "max_new_tokens": t["max_new_tokens"], "kl_coef": t["beta"],
        "policy_updates_per_batch": 1, "clip_eps": t["epsilon"], "temperature": t["temperature"],
        "top_p": t["top_p"], "learning_rate": t["learning_rate"], "steps_per_iteration": t["steps"],
        "iterations": 1, "eval_every": 0, "record_every": 1, "checkpoint_every": 0, "seed": t["seed"],
        "device": "gpu" if cuda else "cpu", "precision": "bf16" if cuda else "fp32",
        "prompt_template": "chat" if chat else "auto",
    })
    # prompt tokens of each question (for the FLOP estimate: the prompt text both sides get), counted before training
    tokenizer = AutoTokenizer.from_pretrained(t["model_dir"])
    prompt_len = {e["question"]: len(tokenizer(prompt_text(tokenizer, e["question"], chat),
                                               add_special_tokens=False)["input_ids"])
                  for e in load_dataset("builtin-arith")[0]}
    memory = TrainingMemory(cuda)

    class Timer(StepTimer):
        """StepTimer that also resets the memory peak at start and keeps what each step processed."""

        def __init__(self, inner):
            super().__init__(inner)
            self.prompt_tokens: list[int] = []
            self.metrics: list[dict[str, float]] = []

        def start(self, total_steps: int) -> None:
            memory.reset()
            super().start(total_steps)

        def groups(self, step, groups) -> None:
            self.prompt_tokens.append(spec.group_size * sum(prompt_len[g.prompt] for g in groups))
            super().groups(step, groups)

        def step(self, step: int, iteration: int, metrics: dict[str, float]) -> None:
            self.metrics.append({k: metrics[k] for k in ("completion_len", *PHASES)})
            super().step(step, iteration, metrics)

    with recorder_for(spec, t["record"], "vs-trl") as (inner, _, _):  # the store, as the worker records
        timer = Timer(inner)
        result = train(spec, timer, Path(t["cache_dir"]), device=None if cuda else "cpu")
        timer.finish()  # the writes still queued at the end count in the last step
        peak = memory.peak()
        assert result["status"] == "completed", result
    n = spec.batch_size * spec.group_size
    return {
        "step_seconds": timer.step_seconds,
        "completion_tokens": [round(m["completion_len"] * n) for m in timer.metrics],
        "prompt_tokens": timer.prompt_tokens,
        **{f"{phase[5:]}_seconds": [m[phase] for m in timer.metrics] for phase in PHASES},
        "trajectory": timer.trajectory,
        "recording_seconds": sum(timer.recording_seconds.values()),
        "memory_before": memory.before,
        "memory_peak": peak,
    }


def trl_trial(t: dict) -> dict:
    """trl.GRPOTrainer on the trial's settings, with the engine's questions, prompts and verifier.

    One function over ~80 lines: TRL's config, its reward function and its timing callback are read best
    side by side with the engine's trial they mirror."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpo_engine.data import load_dataset
    from grpo_engine.rewards import outcome_reward

    cuda = t["device"] == "cuda"
    n = t["batch_size"] * t["group_size"]
    tokenizer = AutoTokenizer.from_pretrained(t["model_dir"])  # pads on the left, pad token <pad>
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(t["model_dir"], use_safetensors=True)  # fp32, as the engine loads it
    chat = t.get("chat", False)
    dataset = Dataset.from_list([{"prompt": prompt_text(tokenizer, e["question"], chat), "answer": e["answer"]}
                                 for e in load_dataset("builtin-arith")[0]])
    completion_tokens: list[int] = []

    def verifier(prompts, completions, completion_ids, answer, **_) -> list[float]:
        """The engine's verifier. TRL passes the dataset's other columns (answer) and each completion's token
        ids up to and including its first EOS, which count the step's completion tokens as the engine does."""
        assert len(completions) == n, f"{len(completions)} completions in a step, expected B x G = {n}"
        completion_tokens.append(sum(map(len, completion_ids)))
        return [outcome_reward(c, a)[0] for c, a in zip(completions, answer)]

    memory = TrainingMemory(cuda)
    step_seconds: list[float] = []

    class StepClock(TrainerCallback):
        """Wall time between the ends of successive optimizer steps (the first from on_train_begin)."""

        def on_train_begin(self, args, state, control, **kwargs):
            memory.reset()
            self.last = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            now = time.perf_counter()
            step_seconds.append(now - self.last)
            self.last = now

    out_dir = tempfile.mkdtemp(prefix="grpo-vs-trl-out-")
    config = GRPOConfig(
        output_dir=out_dir,
        # Batch sizes: in GRPOConfig they count completions, not prompts. generation_batch_size =
        # per_device_train_batch_size x processes x steps_per_generation = B*G completions = B prompts x G,
        # generated once per optimizer step (gradient_accumulation_steps 1, steps_per_generation 1).
        per_device_train_batch_size=n,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_generations=t["group_size"],
        num_iterations=1,  # mu
        max_completion_length=t["max_new_tokens"],
        temperature=t["temperature"],
        top_p=t["top_p"],
        top_k=0,  # no top-k filtering
        beta=t["beta"],
        epsilon=t["epsilon"],
        loss_type="grpo",  # each sequence's token mean, then the mean over sequences (the paper's Eq. 3)
        scale_rewards="group",  # advantages divided by the std within each group
        use_bias_correction_kl=False,  # the paper's k3 KL term, not multiplied by the (differentiable) ratio
        learning_rate=t["learning_rate"],
        lr_scheduler_type="constant",  # the engine keeps the rate constant (TRL's default decays it linearly)
        optim="adamw_torch",  # torch.optim.AdamW as the engine has it (transformers' default: the fused variant)
        weight_decay=0.0,
        max_grad_norm=1.0,
        max_steps=t["steps"],
        seed=t["seed"],
        activation_checkpointing=False,  # TRL's default (gradient_checkpointing) is on; the engine keeps activations
        bf16=cuda,  # TRL's default is on, even on the CPU
        use_cpu=not cuda,
        use_vllm=False,
        report_to="none",
        save_strategy="no",
        eval_strategy="no",
        logging_steps=1,  # metrics every step, as the engine reports them
        log_completions=False,
        disable_tqdm=True,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=verifier, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[StepClock()])
    try:
        trainer.train()
        peak = memory.peak()
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    assert len(step_seconds) == len(completion_tokens) == t["steps"], (len(step_seconds), len(completion_tokens))
    return {"step_seconds": step_seconds, "completion_tokens": completion_tokens,
            "memory_before": memory.before, "memory_peak": peak}


def prompt_text(tokenizer, question: str, chat: bool) -> str:
    """The prompt text both sides train on: the plain template (``question\\n``), or with ``chat`` the tokenizer's
    chat template with the question as the user's turn and the assistant's turn opened (the engine's
    prompt_template "chat"; TRL gets the same text as a plain string prompt)."""
    from grpo_engine.data import format_prompt

    if not chat:
        return format_prompt(question)
    return tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                         add_generation_prompt=True)


def run_trial(t: dict) -> dict:
    result = trl_trial(t) if t["variant"] == "trl" else engine_trial(t)
    if t["device"] == "cuda":
        import torch

        result["device_name"] = torch.cuda.get_device_name()
    return result


# ---- the models --------------------------------------------------------------------------------------

def write_random_model(name: str, out_dir: Path, seed: int, chat: bool = False) -> None:
    """A causal LM of ARCH[name] with random weights (seeded) and the built-in tokenizer, saved to out_dir.

    ``chat``: the tokenizer also gets ChatML's special tokens and template, with <|im_end|> as its EOS, as
    Qwen2 instruct models have them (bench/gpu_check.py's model)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    from grpo_engine.model import build_tokenizer

    config_class, arch = ARCH[name]
    tokenizer = build_tokenizer()
    if chat:
        tokenizer.add_special_tokens({"additional_special_tokens": list(CHATML["special"])})
        tokenizer.eos_token = CHATML["eos"]
        tokenizer.chat_template = CHATML["template"]
    arch = {"vocab_size": len(tokenizer), **arch}
    config = getattr(transformers, config_class)(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                                                 bos_token_id=None, tie_word_embeddings=True, **arch)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out_dir)  # config.json + model.safetensors (fp32)
    tokenizer.save_pretrained(out_dir)


def prepare_model(name: str, cache_dir: Path, work_dir: Path, seed: int, chat: bool = False) -> tuple[str, int]:
    """(local model directory, parameter count) of a configuration (``chat``: see write_random_model)."""
    from transformers import AutoModelForCausalLM

    from grpo_engine.model import builtin_model_dir

    if name == "builtin":
        model_dir = builtin_model_dir(cache_dir, log=lambda message: print(f"  {message}", flush=True))
    else:
        model_dir = work_dir / name
        write_random_model(name, model_dir, seed, chat=chat)
    model = AutoModelForCausalLM.from_pretrained(model_dir, use_safetensors=True)
    return str(model_dir), sum(p.numel() for p in model.parameters())  # tied embeddings counted once


def run_child(trial: dict) -> dict:
    """run_trial in a fresh Python process; its result is the stdout line after RESULT."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}  # no network at all
    out = subprocess.run([sys.executable, __file__, "--trial", json.dumps(trial)], capture_output=True, text=True,
                         env=env)
    lines = [line[len(RESULT):] for line in out.stdout.splitlines() if line.startswith(RESULT)]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"the {trial['variant']} trial of {trial['config']} failed (exit {out.returncode}):\n"
                         f"{out.stdout[-2000:]}\n{out.stderr[-6000:]}")
    return json.loads(lines[-1])


# ---- the report ----------------------------------------------------------------------------------------

class Pooled:
    """A variant's measured (non-warm-up) steps, of one repeat (``r``) or of every repeat of a configuration."""

    def __init__(self, results: list[dict], warmup: int, n: int):
        self.results = results
        self.warmup = warmup
        self.n = n  # completions per step

    def total(self, key: str, r: dict | None = None) -> float:
        """Sum of a per-step series over the measured steps."""
        return sum(sum(x[key][self.warmup:]) for x in ([r] if r else self.results))

    def steps(self, r: dict | None = None) -> int:
        return sum(len(x["step_seconds"][self.warmup:]) for x in ([r] if r else self.results))

    def completions_per_s(self, r: dict | None = None) -> float:
        return self.n * self.steps(r) / self.total("step_seconds", r)

    def tokens_per_s(self, r: dict | None = None) -> float:
        return self.total("completion_tokens", r) / self.total("step_seconds", r)

    def mean(self, key: str) -> float:
        """Mean per measured step of a per-step series, all repeats pooled."""
        return self.total(key) / self.steps()

    def memory(self) -> tuple[float, float]:
        """Median over repeats of (bytes at reset, peak bytes)."""
        return (statistics.median(r["memory_before"] for r in self.results),
                statistics.median(r["memory_peak"] for r in self.results))


def percent(a: float, b: float) -> float:
    return 100.0 * (a - b) / b


def flops(x: float) -> str:
    return f"{x / 1e12:.1f} TFLOP/s" if x >= 1e12 else f"{x / 1e9:.1f} GFLOP/s"


def report_config(config: str, params: int, cuda: bool, pooled: dict[str, Pooled], args) -> list[tuple[str, bool]]:
    """Print one configuration's table; return its (check, passed) lines."""
    memory_kind = "CUDA max allocated" if cuda else "peak RSS (VmHWM)"
    device = f"bf16 autocast on {pooled['trl'].results[0]['device_name']}" if cuda else "fp32 on the CPU"
    print(f"\n== {config}: {params:,} parameters, {device}; {pooled['trl'].steps() // args.repeats} measured steps x "
          f"{args.repeats} repeats; rates = total over total time of the measured steps ==")
    print(f"{'variant':<11} {'compl/s':>8} {'tokens/s':>9} {'s/step':>7} {'tok/compl':>9} "
          f"{'memory: at start -> ' + memory_kind:>44}  compl/s per repeat")
    for name, p in pooled.items():
        before, peak = p.memory()
        per_repeat = ", ".join(f"{p.completions_per_s(r):.1f}" for r in p.results)
        print(f"{name:<11} {p.completions_per_s():8.1f} {p.tokens_per_s():9.1f} {p.mean('step_seconds'):7.3f} "
              f"{p.mean('completion_tokens') / p.n:9.1f} {before / MB:14.1f} MB -> {peak / MB:8.1f} MB "
              f"(+{(peak - before) / MB:7.1f})  {per_repeat}")
    for name, p in pooled.items():
        rates = [p.completions_per_s(r) for r in p.results]
        if max(rates) > CONSISTENT * min(rates):
            print(f"WARNING: the {name} repeats differ by {100 * (max(rates) / min(rates) - 1):.0f}%: another "
                  "process probably took the machine; rerun on an idle one")

    engine, trl = pooled["engine off"], pooled["trl"]
    ratio = engine.completions_per_s() / trl.completions_per_s()
    per_round = ", ".join(f"{engine.completions_per_s(e) / trl.completions_per_s(r):.2f}"
                          for e, r in zip(engine.results, trl.results))
    print(f"engine / TRL: completions/s {ratio:.2f}x (per round {per_round}), "
          f"tokens/s {engine.tokens_per_s() / trl.tokens_per_s():.2f}x, "
          f"peak memory {engine.memory()[1] / trl.memory()[1]:.2f}x")
    report_engine_work(engine, params)
    checks = []
    if not cuda:
        checks.append((f"{config}: engine / TRL completions/s {ratio:.2f} >= {args.min_ratio}", ratio >= args.min_ratio))
    if "engine on" in pooled:
        on = pooled["engine on"]
        same = all(a["trajectory"] == b["trajectory"] for a in engine.results for b in on.results)
        overhead = percent(on.mean("step_seconds"), engine.mean("step_seconds"))
        # time the training loop spent inside DBRecorder's methods (the writes themselves run on its writer
        # thread), over all steps (it is not split per step)
        recording = sum(r["recording_seconds"] for r in on.results) / sum(len(r["step_seconds"]) for r in on.results)
        print(f"recording overhead (on vs off, mean s/step): {overhead:+.2f}%; time the loop spent in DBRecorder "
              f"calls {recording:.4f} s/step; off and on sampled the same completions: {'yes' if same else 'NO'}")
        checks.append((f"{config}: recording overhead {overhead:+.2f}% <= {args.max_overhead}%",
                       overhead <= args.max_overhead))
    return checks


def report_engine_work(engine: Pooled, params: int) -> None:
    """The engine's phases (its time/* metrics) and achieved FLOP/s (formulas in the module docstring)."""
    sampling, scoring, update = (engine.mean(f"{phase}_seconds") for phase in ("sampling", "scoring", "update"))
    tokens = (engine.total("prompt_tokens") + engine.total("completion_tokens")) / engine.steps()
    print(f"engine off, s/step: sampling {sampling:.3f}, scoring {scoring:.3f}, update {update:.3f}; "
          f"{tokens:,.0f} prompt + completion tokens/step")
    print(f"engine off FLOP/s: update 6 n tokens / time/update = {flops(6 * params * tokens / update)}; "
          f"with the reference forward 8 n tokens / (time/update + time/scoring) = "
          f"{flops(8 * params * tokens / (update + scoring))}")


# ---- main ------------------------------------------------------------------------------------------------

def main() -> int:
    """Parse the flags, run the trials alternated and print the comparison tables (over ~80 lines: the flags
    and the table columns read as one list each)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", help="built-in model cache (default: a temporary dir; the model is built there first)")
    parser.add_argument("--configs", default=",".join(CPU_CONFIGS), help=f"of {', '.join(CPU_CONFIGS + (GPU_CONFIG,))}")
    parser.add_argument("--gpu", action="store_true", help=f"add {GPU_CONFIG} (needs CUDA)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds; each runs every variant of every configuration once")
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps per trial (llama25m, qwen05b)")
    parser.add_argument("--builtin-steps", type=int, default=60, help="optimizer steps per trial of builtin (fast steps)")
    parser.add_argument("--warmup", type=int, default=2, help="first steps of each trial left out of the rates")
    parser.add_argument("--batch-size", type=int, default=8, help="B: questions per step")
    parser.add_argument("--group-size", type=int, default=8, help="G: completions per question")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--beta", type=float, default=0.04, help="KL coefficient")
    parser.add_argument("--epsilon", type=float, default=0.2, help="clip range")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--learning-rate", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-ratio", type=float, default=1.5, help="PASS when engine / TRL completions/s is at least this")
    parser.add_argument("--max-overhead", type=float, default=5.0, help="PASS when recording adds at most this, in percent")
    parser.add_argument("--trial", help=argparse.SUPPRESS)  # a trial as JSON: run it in this process
    args = parser.parse_args()

    if args.trial:
        print(RESULT + json.dumps(run_trial(json.loads(args.trial))), flush=True)
        return 0

    configs = [c for c in args.configs.split(",") if c]
    if args.gpu and GPU_CONFIG not in configs:
        configs.append(GPU_CONFIG)
    unknown = set(configs) - set(CPU_CONFIGS + (GPU_CONFIG,))
    if unknown:
        parser.error(f"unknown configuration {', '.join(sorted(unknown))}")
    if not 0 <= args.warmup < min(args.steps, args.builtin_steps):
        parser.error("--warmup must be less than --steps and --builtin-steps")
    if GPU_CONFIG in configs:
        import torch

        if not torch.cuda.is_available():
            parser.error(f"{GPU_CONFIG} needs a CUDA GPU")

    work_dir = Path(tempfile.mkdtemp(prefix="grpo-vs-trl-"))
    cache_dir = Path(args.cache_dir).resolve() if args.cache_dir else work_dir / "cache"
    settings = dict(batch_size=args.batch_size, group_size=args.group_size, max_new_tokens=args.max_new_tokens,
                    beta=args.beta, epsilon=args.epsilon, temperature=args.temperature, top_p=args.top_p,
                    learning_rate=args.learning_rate, seed=args.seed, cache_dir=str(cache_dir))
    print(f"settings: {json.dumps({k: v for k, v in settings.items() if k != 'cache_dir'})}, mu 1, "
          f"steps per trial {args.builtin_steps} (builtin) or {args.steps}, the first {args.warmup} left out, "
          f"repeats {args.repeats}; model cache {cache_dir}", flush=True)
    try:
        models = {}
        for config in configs:
            t0 = time.perf_counter()
            models[config] = prepare_model(config, cache_dir, work_dir, args.seed)
            print(f"{config}: {models[config][1]:,} parameters at {models[config][0]} "
                  f"(ready in {time.perf_counter() - t0:.1f}s)", flush=True)

        variants = {c: ["engine off", "trl"] + (["engine on"] if c in RECORDED else []) for c in configs}
        results: dict[str, dict[str, list[dict]]] = {c: {v: [] for v in variants[c]} for c in configs}
        for round_ in range(args.repeats):
            for config in configs:
                k = round_ % len(variants[config])
                for variant in variants[config][k:] + variants[config][:k]:
                    trial = {**settings, "config": config, "variant": variant, "model_dir": models[config][0],
                             "steps": args.builtin_steps if config == "builtin" else args.steps,
                             "record": variant == "engine on", "device": "cuda" if config == GPU_CONFIG else "cpu"}
                    t0 = time.perf_counter()
                    r = run_child(trial)
                    results[config][variant].append(r)
                    p = Pooled([r], args.warmup, args.batch_size * args.group_size)
                    print(f"round {round_ + 1} {config:<8} {variant:<10}: {p.completions_per_s():7.1f} completions/s, "
                          f"{p.tokens_per_s():8.1f} tokens/s, {p.mean('step_seconds'):.3f} s/step "
                          f"({time.perf_counter() - t0:.0f}s with set-up)", flush=True)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)

    checks = []
    n = args.batch_size * args.group_size
    for config in configs:
        pooled = {v: Pooled(rs, args.warmup, n) for v, rs in results[config].items()}
        checks += report_config(config, models[config][1], config == GPU_CONFIG, pooled, args)
    missing = [c for c in CPU_CONFIGS if c not in configs]
    print()
    if missing:
        print(f"(not run: {', '.join(missing)}; the acceptance check needs every CPU configuration in one run)")
    for line, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'} {line}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
