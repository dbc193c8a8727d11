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

  engine off  grpo_engine.trainer.train with a recorder that records nothing
  engine on   the same with the worker's DBRecorder on a fresh migrated SQLite store (as
              bench/recording_overhead.py does; builtin only): the dashboard's rate while it records
  trl         trl.GRPOTrainer (options and why: see trl_trial)

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
          grpo_engine.sampling.PRUNE_SHARE of those still decoded (the sampler's loop, replayed from the
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

    .venv/bin/python bench/vs_trl.py --cache-dir /tmp/bc    # reuse a built-in model cached there
    .venv/bin/python bench/vs_trl.py                        # a fresh cache: builds the built-in model first (~2 min)
    .venv/bin/python bench/vs_trl.py --cache-dir /tmp/bc --configs builtin --repeats 1 --builtin-steps 12
    .venv/bin/python bench/vs_trl.py --cache-dir /tmp/bc --configs longprompt --repeats 1   # 10-15 min on 2 cores
    .venv/bin/python bench/vs_trl.py --cache-dir /tmp/bc --configs qwen05b --repeats 2             # on a GPU
    .venv/bin/python bench/vs_trl.py --cache-dir /tmp/bc --configs qwen05b --decode compiled       # its decode path

Needs trl (``pip install trl``; written against trl 1.16). PASS lines: the engine's completions/s is at
least TARGETS x TRL's on each CPU configuration run (builtin 1.7, longprompt 2.0, llama25m 1.0; --min-ratio
sets one target for all), and recording adds at most --max-overhead (5%) to the engine's mean step time on
builtin, as bench/recording_overhead.py measures it at the end of the run (--overhead-repeats pairs of runs
timing recording on and off in alternating blocks of steps: a difference of a few percent is below the
spread of whole trials in separate processes, whose engine on / off ratio is printed for information).
Exit status 0 when every check passes; the acceptance check needs every CPU configuration in one run.
"""
from __future__ import annotations

import argparse
import functools
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
CPU_CONFIGS = ("builtin", "llama25m", "longprompt")
GPU_CONFIG = "qwen05b"
RECORDED = ("builtin",)  # configurations that also run the engine with recording on
TARGETS = {"builtin": 1.7, "longprompt": 2.0, "llama25m": 1.0}  # PASS: engine / TRL completions/s at least this
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
# longprompt's default system prompt: 313 tokens with the built-in tokenizer (a token per character, one per
# number of up to 3 digits); plain printable ASCII (every character in its vocabulary) and no braces (it goes
# into the template's text as it is)
SYSTEM_PROMPT = ("You are an arithmetic tutor. Work the question out one operation at a time: multiply before you "
                 "add or subtract, and go from left to right among operations of the same rank. Write each step "
                 "as an equation on its own line, such as 3*4=12, and check it before you go on. Give the final "
                 "number alone on the last line.")
LONG_CHATML = dict(CHATML, template=(  # ChatML, the system prompt inserted where the messages have no system turn
    "{% if not messages or messages[0]['role'] != 'system' %}<|im_start|>system\n" + SYSTEM_PROMPT
    + "<|im_end|>\n{% endif %}" + CHATML["template"]))
# longprompt's outputs of uneven length (module docstring): every embedding row gets `shared` on `coordinate`, the
# EOS row its random part zeroed and `eos` more there. eos 1.4 was found by sampling (4 questions x 8, 128 new
# tokens, model seeds 0-2): 1.3 gives mean lengths 69-78, 1.5 gives 52-55
EOS_LIFT = dict(coordinate=0, shared=1.0, eos=1.4)
MODELS = {  # the random models: their ARCH and what write_random_model adds (chat format, EOS lift)
    "llama25m": dict(arch="llama25m"),
    "longprompt": dict(arch="llama25m", chat=LONG_CHATML, eos_lift=EOS_LIFT),
    "qwen05b": dict(arch="qwen05b"),
}
# per configuration, what differs from the shared flags (a function of the parsed flags); the steps: STEP_FLAGS
OVERRIDES = {
    "longprompt": lambda a: dict(batch_size=a.long_batch_size, max_new_tokens=128, chat=True),
}
STEP_FLAGS = {"builtin": "--builtin-steps", "longprompt": "--long-steps"}  # steps per trial; the others: --steps
LENGTH_CHECK = 8  # questions whose G completions the header samples to show a configuration's output lengths
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
        "prompt_template": "chat" if chat else "auto", "decode": t.get("decode", "dynamic"),
    })
    # prompt tokens of each question (for the step's work: the prompt text both sides get, as the engine encodes
    # it), counted before training
    tokenizer = AutoTokenizer.from_pretrained(t["model_dir"])
    prompt_len = {e["question"]: len(tokenizer(prompt_text(tokenizer, e["question"], chat),
                                               add_special_tokens=False)["input_ids"])
                  for e in load_dataset("builtin-arith")[0]}
    memory = TrainingMemory(cuda)

    class Timer(StepTimer):
        """StepTimer that also resets the memory peak at start and keeps what each step processed."""

        def __init__(self, inner):
            super().__init__(inner)
            self.work: list[dict[str, int]] = []  # per step: the tokens fed to the model (engine_step_tokens)
            self.metrics: list[dict[str, float]] = []

        def start(self, total_steps: int) -> None:
            memory.reset()
            super().start(total_steps)

        def groups(self, step, groups) -> None:
            lengths = [len(s.tokens) for g in groups for s in g.samples]  # each completion's tokens, its EOS included
            self.work.append(engine_step_tokens([prompt_len[g.prompt] for g in groups], lengths, spec.max_new_tokens))
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
    assert len(timer.work) == len(timer.step_seconds), (len(timer.work), len(timer.step_seconds))
    n = spec.batch_size * spec.group_size
    return {
        "step_seconds": timer.step_seconds,
        "completion_tokens": [round(m["completion_len"] * n) for m in timer.metrics],
        **work_series(timer.work, spec.kl_coef > 0),
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
    work: list[dict[str, int]] = []  # per step: the tokens fed to the model (trl_step_tokens)
    prompt_len: dict[str, int] = {}  # prompt text -> its tokens, counted as the engine counts them

    def verifier(prompts, completions, completion_ids, answer, **_) -> list[float]:
        """The engine's verifier. TRL passes the prompts' text, the dataset's other columns (answer) and each
        completion's token ids up to and including its first EOS, which count the step's completion tokens as
        the engine does, and its work."""
        assert len(completions) == n, f"{len(completions)} completions in a step, expected B x G = {n}"
        lengths = list(map(len, completion_ids))
        completion_tokens.append(sum(lengths))
        for p in set(prompts) - prompt_len.keys():  # TRL tokenizes with special tokens: neither tokenizer adds any
            prompt_len[p] = len(tokenizer(p, add_special_tokens=False)["input_ids"])
        work.append(trl_step_tokens([prompt_len[p] for p in prompts], lengths))
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
    return {"step_seconds": step_seconds, "completion_tokens": completion_tokens, **work_series(work, t["beta"] > 0),
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


# ---- the work of a step -----------------------------------------------------------------------------------

def decoded_tokens(lengths: list[int], max_new_tokens: int, prune_share: float) -> int:
    """Tokens the engine's sampler decodes for completions of ``lengths`` (their EOS included; a completion cut
    at max_new_tokens has that length): one per row of the decoded batch and step, replaying
    grpo_engine.sampling._decode's loop, which stops when every row has ended or at max_new_tokens and drops
    the rows that ended once they are at least ``prune_share`` of the rows it decodes. The first step's token
    comes from the prefill's logits, so the decode forwards take N tokens fewer (TRL's count is made the same way).

    Example: lengths [1, 1, 1, 4], share 0.25: step 1 samples 4 rows, 3 end and are dropped; steps 2-4 one row
    each: 7 (16 without dropping).
    """
    rows, total = list(lengths), 0
    for t in range(1, max_new_tokens + 1):  # t tokens sampled per row once this step is done
        total += len(rows)
        live = [length for length in rows if length > t]
        if not live or t == max_new_tokens:
            break
        if len(live) <= (1 - prune_share) * len(rows):  # the sampler's rule: drop the rows that have ended
            rows = live
    return total


def engine_step_tokens(prompt_lens: list[int], lengths: list[int], max_new_tokens: int) -> dict[str, int]:
    """Tokens the engine feeds its model in a step of B prompts (``prompt_lens``, real tokens) and N completions
    (``lengths``, EOS included; module docstring): prefill B x P, decode (decoded_tokens), and each training
    forward (the reference's, the update's) B x P + N x T, one micro-batch holding all N."""
    from grpo_engine.sampling import PRUNE_SHARE

    prefill = len(prompt_lens) * max(prompt_lens)
    return {"prefill": prefill, "decode": decoded_tokens(lengths, max_new_tokens, PRUNE_SHARE),
            "forward": prefill + len(lengths) * max(lengths)}


def trl_step_tokens(prompt_lens: list[int], lengths: list[int]) -> dict[str, int]:
    """Tokens TRL feeds its model in a step of N prompts (``prompt_lens``, each of the B repeated G times) and N
    completions (``lengths``, EOS included; module docstring): prefill N x P, decode N x T (HF generate decodes
    every row until the last has ended), and each training forward N x (P + T) (both padded to the longest)."""
    n, p, t = len(lengths), max(prompt_lens), max(lengths)
    return {"prefill": n * p, "decode": n * t, "forward": n * (p + t)}


def work_series(work: list[dict[str, int]], reference: bool) -> dict:
    """A trial's per-step token counts as the result's series (prefill_tokens, ...), and whether it ran a
    reference forward (beta > 0)."""
    return {**{f"{k}_tokens": [w[k] for w in work] for k in ("prefill", "decode", "forward")},
            "reference_pass": reference}


# ---- the models --------------------------------------------------------------------------------------

def write_random_model(name: str, out_dir: Path, seed: int, chat: bool = False) -> None:
    """A causal LM of MODELS[name] (its ARCH, random weights (seeded), the built-in tokenizer), saved to out_dir.

    Its chat format: MODELS[name]'s (longprompt: ChatML with a default system prompt), or with ``chat`` ChatML's
    special tokens and template; either way <|im_end|> is its EOS, as Qwen2 instruct models have them
    (bench/gpu_check.py's model: qwen05b with ``chat``). MODELS[name]'s eos_lift: see lift_eos."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    from grpo_engine.model import build_tokenizer

    model_spec = MODELS[name]
    config_class, arch = ARCH[model_spec["arch"]]
    chat_format = model_spec.get("chat") or (CHATML if chat else None)
    tokenizer = build_tokenizer()
    if chat_format:
        tokenizer.add_special_tokens({"additional_special_tokens": list(chat_format["special"])})
        tokenizer.eos_token = chat_format["eos"]
        tokenizer.chat_template = chat_format["template"]
    arch = {"vocab_size": len(tokenizer), **arch}
    config = getattr(transformers, config_class)(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                                                 bos_token_id=None, tie_word_embeddings=True, **arch)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    if "eos_lift" in model_spec:
        lift_eos(model, tokenizer.eos_token_id, **model_spec["eos_lift"])
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out_dir)  # config.json + model.safetensors (fp32)
    tokenizer.save_pretrained(out_dir)


def lift_eos(model, eos_id: int, coordinate: int, shared: float, eos: float) -> None:
    """Raise the EOS logit of a random model with tied embeddings by a roughly constant amount (module docstring,
    longprompt): every embedding row gets ``shared`` on ``coordinate`` (the residual stream carries it to the
    final RMSNorm, whose output there is then about the same in every context), the EOS row loses its random
    part (so that its logit does not depend on the seed) and gets ``eos`` more there. The output layer is the
    embedding, so every logit moves by the shared amount (which softmax cancels) and EOS's by ``eos`` more
    times that normalised coordinate."""
    import torch

    weight = model.get_input_embeddings().weight
    assert weight is model.get_output_embeddings().weight, "lift_eos needs tied embeddings"
    with torch.no_grad():
        weight[eos_id] = 0.0
        weight[:, coordinate] += shared
        weight[eos_id, coordinate] += eos


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


def show_prompt_and_lengths(model_dir: str, s: dict) -> None:
    """Print a chat configuration's prompt length (its system prompt's tokens, each checked to be in the
    vocabulary, and the whole prompt's over the training questions) and the lengths of completions sampled as
    the engine's step samples them (grpo_engine.sampling.generate: LENGTH_CHECK questions x G, the trial's
    temperature, top-p and max new tokens, seeded): what the EOS lift gives."""
    import torch

    from grpo_engine.data import load_dataset
    from grpo_engine.model import load_causal_lm
    from grpo_engine.outputs import encode_prompts
    from grpo_engine.sampling import generate
    from grpo_engine.tokenization import completion_mask, end_token_ids

    model, tokenizer = load_causal_lm(model_dir)
    tokenizer.padding_side = "left"
    system = tokenizer(SYSTEM_PROMPT, add_special_tokens=False)["input_ids"]
    if tokenizer.unk_token_id in system:
        raise SystemExit(f"the system prompt has characters the tokenizer does not know: {SYSTEM_PROMPT!r}")
    questions = [e["question"] for e in load_dataset("builtin-arith")[0]]
    text = functools.partial(prompt_text, tokenizer, chat=s["chat"])  # question -> the text both sides train on
    prompts = [len(tokenizer(text(q), add_special_tokens=False)["input_ids"]) for q in questions]
    torch.manual_seed(s["seed"])
    out = generate(model.eval(), tokenizer, encode_prompts(tokenizer, questions[:LENGTH_CHECK], "cpu", text),
                   repeat=s["group_size"], max_new_tokens=s["max_new_tokens"], greedy=False,
                   temperature=s["temperature"], top_p=s["top_p"])
    mask, ended = completion_mask(out, end_token_ids(model, tokenizer))
    lengths = mask.sum(dim=1).long().tolist()
    print(f"  system prompt {len(system)} tokens; prompts {min(prompts)}-{max(prompts)} tokens "
          f"(mean {statistics.mean(prompts):.1f}); {len(lengths)} sampled completions ({LENGTH_CHECK} questions x "
          f"{s['group_size']}): length mean {statistics.mean(lengths):.1f}, median {statistics.median(lengths):.0f}, "
          f"min {min(lengths)}, max {max(lengths)}, cut at {s['max_new_tokens']} {1 - ended.float().mean():.0%}",
          flush=True)


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

    def phase_flops(self, params: int) -> dict[str, float]:
        """Mean FLOPs per measured step by phase (module docstring): sampling (prefill and decode), the reference
        forward (0 where the trials ran none) and the update's forward + backward, ``params`` = n."""
        forward = self.mean("forward_tokens")
        reference = all(r["reference_pass"] for r in self.results)
        return {"sampling": 2 * params * (self.mean("prefill_tokens") + self.mean("decode_tokens")),
                "reference": 2 * params * forward if reference else 0.0, "update": 6 * params * forward}


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
        print(f"engine on vs off trials, mean s/step: {overhead:+.2f}% (whole trials, for information; the "
              f"recording check below times on and off within runs); time the loop spent in DBRecorder calls "
              f"{recording:.4f} s/step; off and on sampled the same completions: {'yes' if same else 'NO'}")
    return checks


def recording_check(cache_dir: Path, args) -> tuple[str, bool]:
    """bench/recording_overhead.py on the built-in model in ``cache_dir``, in a fresh process, its output shown;
    the check's line is its overhead line."""
    command = [sys.executable, str(Path(__file__).resolve().parent / "recording_overhead.py"), "--cache-dir",
               str(cache_dir), "--repeats", str(args.overhead_repeats), "--max-overhead", str(args.max_overhead)]
    print(f"\nrecording overhead on builtin: {' '.join(command[1:])}", flush=True)
    out = subprocess.run(command, capture_output=True, text=True)
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
    print(f"engine off, s/step: sampling {sampling:.3f}, scoring {scoring:.3f}, update {update:.3f}; "
          f"{engine.mean('forward_tokens'):,.0f} tokens per training forward (B x P + N x T)")
    print(f"engine off FLOP/s: sampling 2 n x (prefill + decode tokens) / time/sampling = "
          f"{flops(f['sampling'] / sampling)}; update 6 n x forward tokens / time/update = "
          f"{flops(f['update'] / update)}; with the reference forward (its FLOPs + the update's) / "
          f"(time/update + time/scoring) = {flops((f['update'] + f['reference']) / (update + scoring))}")


def report_flops(engine: Pooled, trl: Pooled, params: int, speed: float) -> None:
    """Each trainer's mean FLOPs per step by phase and in all (with the tokens behind them), the FLOP/s that makes
    at its mean step time, and TRL's total over the engine's next to the measured speed ratio ``speed``."""
    sides = {"engine off": (engine, "sampling"), "trl": (trl, "generation")}
    work = {name: p.phase_flops(params) for name, (p, _) in sides.items()}
    total = {name: sum(f.values()) for name, f in work.items()}
    unit, scale = ("TFLOP", 1e12) if max(total.values()) >= 1e12 else ("GFLOP", 1e9)
    print(f"FLOPs per step in {unit} (2 n per token of a forward, 6 n of a forward + backward, n = {params:,}; "
          "attention's score products left out):")
    for name, (p, first) in sides.items():
        f = work[name]
        print(f"{name:<11} {first} {f['sampling'] / scale:.3g} (prefill {p.mean('prefill_tokens'):,.0f} + decode "
              f"{p.mean('decode_tokens'):,.0f} tokens) + reference {f['reference'] / scale:.3g} + update "
              f"{f['update'] / scale:.3g} ({p.mean('forward_tokens'):,.0f} tokens each) = {total[name] / scale:.3g} "
              f"{unit}: {flops(total[name] / p.mean('step_seconds'))} at {p.mean('step_seconds'):.3f} s/step")
    print(f"TRL / engine FLOPs per step {total['trl'] / total['engine off']:.2f}x; "
          f"measured engine / TRL completions/s {speed:.2f}x")


# ---- main ------------------------------------------------------------------------------------------------

def parse_args() -> argparse.Namespace:
    """The flags; unless --trial, the configurations to run are checked and listed in ``configs`` (over ~80 lines:
    the flags read as one list)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", help="built-in model cache (default: a temporary dir; the model is built there first)")
    parser.add_argument("--configs", default=",".join(CPU_CONFIGS), help=f"of {', '.join(CPU_CONFIGS + (GPU_CONFIG,))}")
    parser.add_argument("--gpu", action="store_true", help=f"add {GPU_CONFIG} (needs CUDA)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds; each runs every variant of every configuration once")
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps per trial (llama25m, qwen05b)")
    parser.add_argument("--builtin-steps", type=int, default=60, help="optimizer steps per trial of builtin (fast steps)")
    parser.add_argument("--long-steps", type=int, default=5, help="optimizer steps per trial of longprompt (slow steps)")
    parser.add_argument("--warmup", type=int, default=2, help="first steps of each trial left out of the rates")
    parser.add_argument("--batch-size", type=int, default=8, help="B: questions per step (longprompt: --long-batch-size)")
    parser.add_argument("--long-batch-size", type=int, default=4, help="B of longprompt (a step near half a minute on 2 cores)")
    parser.add_argument("--group-size", type=int, default=8, help="G: completions per question")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="new tokens per completion at most (longprompt: 128)")
    parser.add_argument("--beta", type=float, default=0.04, help="KL coefficient")
    parser.add_argument("--epsilon", type=float, default=0.2, help="clip range")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--learning-rate", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--decode", default="dynamic", choices=("dynamic", "static", "compiled"),
                        help="the engine's sampler (run-spec key decode; 'compiled': CUDA graphs on a GPU)")
    parser.add_argument("--min-ratio", type=float, help="PASS when engine / TRL completions/s is at least this, on every "
                                                        f"configuration (default: per configuration, {TARGETS})")
    parser.add_argument("--max-overhead", type=float, default=5.0, help="PASS when recording adds at most this, in percent")
    parser.add_argument("--overhead-repeats", type=int, default=4,
                        help="pairs of runs of bench/recording_overhead.py for the recording check (builtin)")
    parser.add_argument("--trial", help=argparse.SUPPRESS)  # a trial as JSON: run it in this process
    args = parser.parse_args()
    if args.trial:
        return args

    configs = [c for c in args.configs.split(",") if c]
    if args.gpu and GPU_CONFIG not in configs:
        configs.append(GPU_CONFIG)
    unknown = set(configs) - set(CPU_CONFIGS + (GPU_CONFIG,))
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
    return dict(batch_size=args.batch_size, group_size=args.group_size, max_new_tokens=args.max_new_tokens,
                beta=args.beta, epsilon=args.epsilon, temperature=args.temperature, top_p=args.top_p,
                learning_rate=args.learning_rate, seed=args.seed, chat=False, decode=args.decode,
                cache_dir=str(cache_dir))


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
                trial = {**s, "config": config, "variant": variant, "model_dir": models[config][0],
                         "record": variant == "engine on", "device": "cuda" if config == GPU_CONFIG else "cpu"}
                t0 = time.perf_counter()
                r = run_child(trial)
                results[config][variant].append(r)
                p = Pooled([r], args.warmup, s["batch_size"] * s["group_size"])
                print(f"round {round_ + 1} {config:<10} {variant:<10}: {p.completions_per_s():7.1f} completions/s, "
                      f"{p.tokens_per_s():8.1f} tokens/s, {p.mean('step_seconds'):.3f} s/step "
                      f"({time.perf_counter() - t0:.0f}s with set-up)", flush=True)
    return results


def main() -> int:
    """Run the trials alternated and print the comparison tables and the checks (with --trial: run that trial)."""
    args = parse_args()
    if args.trial:
        print(RESULT + json.dumps(run_trial(json.loads(args.trial))), flush=True)
        return 0

    work_dir = Path(tempfile.mkdtemp(prefix="grpo-vs-trl-"))
    cache_dir = Path(args.cache_dir).resolve() if args.cache_dir else work_dir / "cache"
    shared = shared_settings(args, cache_dir)
    settings = {c: trial_settings(c, args, shared) for c in args.configs}
    print(f"settings: {json.dumps({k: v for k, v in shared.items() if k != 'cache_dir'})}, mu 1, the first "
          f"{args.warmup} steps of each trial left out, repeats {args.repeats}; model cache {cache_dir}")
    for config, s in settings.items():  # what each configuration has of its own
        print(f"  {config}: {json.dumps({k: v for k, v in s.items() if shared.get(k) != v})}", flush=True)
    try:
        models = {}
        for config in args.configs:
            t0 = time.perf_counter()
            models[config] = prepare_model(config, cache_dir, work_dir, args.seed)
            print(f"{config}: {models[config][1]:,} parameters at {models[config][0]} "
                  f"(ready in {time.perf_counter() - t0:.1f}s)", flush=True)
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
    for line, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'} {line}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
