"""Policies: the built-in tiny model, and loading any causal LM by Hugging Face id or local path (a model
directory, or a .gguf file converted once into one: grpo_engine.model.gguf_model).

The built-in policy (``builtin-arith``) is a small Llama-architecture transformer with its own
small tokenizer (characters, and numbers of up to 3 digits as single tokens). It is created on first use by a short supervised warm start on a
deliberately imperfect mix of solutions (many ignore operator precedence), so it starts at a modest
held-out accuracy and GRPO has something to fix. It is cached on disk as a standard Hugging Face
model directory (config.json, model.safetensors, tokenizer.json) that any transformers tool loads.
"""

from __future__ import annotations

import random
import shutil
import string
import time
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

from grpo_engine.data.builtin_task import warmup_examples
from grpo_engine.data.data import format_prompt
from grpo_engine.model.gguf_model import gguf_model_dir
from grpo_engine.model.model_cache import DTYPE_KEYWORD, build_once
from grpo_engine.spec.config import BUILTIN_MODEL, is_gguf, is_local_path
from grpo_engine.spec.gguf_header import gguf_float_dtype

BUILTIN_VERSION = "v6"  # bump when the recipe below changes; the cache is keyed by it
PAD, EOS, UNK = "<pad>", "</s>", "<unk>"

# The recipe of the built-in policy: ~0.58M parameters; the warm start (900 updates) takes about 80 s on 2 idle
# CPU cores (bench/builtin_build.py) and leaves a model that gets ~35% of the held-out questions right (greedy), mostly by
# ignoring precedence, while its one-step arithmetic is nearly always right: GRPO then takes it past 0.95.
# The warm start is long enough that GRPO is not held back by arithmetic slips (half of it caps GRPO near 0.88).
BUILTIN_ARCH = dict(
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=64,
)
SOURCE_DTYPES = ("float32", "bfloat16", "float16")  # the dtypes a model's trained policy downloads in
WARMUP = dict(examples=8000, wrong_share=0.75, steps=900, batch_size=64, lr=3e-3, seed=0)


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The built-in tokenizer: one token per character of printable ASCII, except that a run of digits
    is cut into numbers of up to 3 digits, each one token ("18-6=12" -> 18 - 6 = 12). With whole
    numbers as tokens, an arithmetic fact is a lookup the tiny model learns quickly, not a carry."""
    numbers = [str(n) for n in range(10)] + [f"{n:02d}" for n in range(100)] + [f"{n:03d}" for n in range(1000)]
    numbers += [str(n) for n in range(10, 1000)]
    chars = [c for c in string.printable[:-2] if not c.isdigit()]  # drop \x0b \x0c
    vocab = {tok: i for i, tok in enumerate(dict.fromkeys([PAD, EOS, UNK, *chars, *numbers]))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern=Regex(r"\d{1,3}|\D"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK, padding_side="left"
    )


def _sft_batch(tokenizer, examples: list[dict]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (input_ids, attention_mask, labels) with loss on the completion only. All (B, T)."""
    ids, labels = [], []
    for ex in examples:
        p = tokenizer.encode(format_prompt(ex["question"]), add_special_tokens=False)
        c = tokenizer.encode(ex["solution"], add_special_tokens=False) + [tokenizer.eos_token_id]
        ids.append(p + c)
        labels.append([-100] * len(p) + c)
    width = max(map(len, ids))
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([x + [pad] * (width - len(x)) for x in ids])
    attention = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids])
    label_t = torch.tensor([y + [-100] * (width - len(y)) for y in labels])
    return input_ids, attention, label_t


def no_progress(done: int, total: int) -> None:
    """The progress report of work nobody follows."""


def create_builtin_model(out_dir: Path, log=print, progress=no_progress) -> None:
    """Warm-start the built-in policy from scratch and save it to ``out_dir``. ``progress(done, total)`` is
    called with the warm-up steps done, before the first and after each one."""
    examples = warmup_examples(WARMUP["examples"], WARMUP["wrong_share"], WARMUP["seed"])
    train_from_scratch(
        out_dir,
        examples,
        BUILTIN_ARCH,
        steps=WARMUP["steps"],
        batch_size=WARMUP["batch_size"],
        lr=WARMUP["lr"],
        seed=WARMUP["seed"],
        log=log,
        progress=progress,
        name="built-in model",
    )


def train_from_scratch(
    out_dir: Path,
    examples: list[dict],
    arch: dict,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    log=print,
    progress=no_progress,
    name: str = "model",
) -> None:
    """A Llama of ``arch`` with the built-in tokenizer, trained from random weights on ``examples`` (``{question,
    solution}``: the loss on the solution only) for ``steps`` batches of ``batch_size`` with AdamW under a one-cycle
    schedule peaking at ``lr``, then saved to ``out_dir`` with its tokenizer. ``progress(done, total)`` follows the
    steps; every 100 the loss is logged as the ``name``'s warm start."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
        **arch,
    )
    model = LlamaForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    model.train()
    start = time.time()
    progress(0, steps)
    for step in range(1, steps + 1):
        input_ids, attention, labels = _sft_batch(tokenizer, rng.sample(examples, batch_size))
        loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        progress(step, steps)
        if step % 100 == 0:
            log(f"{name} warm start: step {step}/{steps} loss {loss.item():.3f} ({time.time() - start:.0f}s)")
    model.eval()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)  # config.json + model.safetensors
    tokenizer.save_pretrained(out_dir)  # tokenizer.json + tokenizer_config.json


def builtin_model_dir(cache_dir: Path, log=print, progress=no_progress) -> Path:
    """The cached built-in policy directory, created on first use (safe across processes); ``progress``
    follows the warm start of that first use (see create_builtin_model)."""
    target = Path(cache_dir) / f"{BUILTIN_MODEL}-{BUILTIN_VERSION}"

    def build(tmp: Path) -> None:
        log("creating the built-in model (first use only)")
        create_builtin_model(tmp, log=log, progress=progress)

    build_once(
        target,
        Path(cache_dir) / f".{BUILTIN_MODEL}.lock",
        build,
        missing="the built-in model was not written; create it from the main process only",
    )
    return target


def write_builtin_model(out_dir: Path, cache_dir: Path, log=print) -> Path:
    """Copy the built-in policy (config, safetensors weights, tokenizer) to ``out_dir``."""
    src = builtin_model_dir(cache_dir, log=log)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file():
            shutil.copy2(f, out_dir / f.name)
    return out_dir


def resolve_model_path(model: str, cache_dir: Path, log=print, progress=no_progress, phase=None) -> str:
    """The directory a run's ``model`` (or ``reward_model``, ``label_completer``) loads from: the built-in preset's
    cached directory (built on first use, ``progress`` following its warm start), a .gguf file's converted
    directory in the cache (converted on first use, reported through ``phase(name)``: grpo_engine.model.gguf_model),
    or ``model`` unchanged (a hub id or a local directory)."""
    if model == BUILTIN_MODEL:
        return str(builtin_model_dir(cache_dir, log=log, progress=progress))
    if is_gguf(model):
        return str(gguf_model_dir(model, cache_dir, log=log, phase=phase))
    return model


def load_causal_lm(path: str, what: str = "model", on_meta: bool = False):
    """(causal LM, tokenizer) from a local directory or a Hugging Face id, safetensors weights only.

    The weights are loaded in fp32 whatever dtype the checkpoint has. ``on_meta``: no weights are read, the model is
    its architecture on the meta device (no memory: every tensor a shape without storage), with the generation
    config (its end tokens) from_pretrained would read; a run's processes besides the main one start so, their
    weights sent by the main process (grpo_engine.train.loading.load_policy_once). A missing local path or an
    unloadable id raises FileNotFoundError naming ``what`` and the path; a tokenizer without a pad token uses EOS.
    """
    if is_local_path(path) and not Path(path).expanduser().exists():
        raise FileNotFoundError(f"{what} path {path!r} does not exist")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        # fp32 whatever the checkpoint's dtype (instruct models ship bf16, which transformers 5 would keep):
        # AdamW's small updates vanish in bf16 weights; autocast runs the forward passes in bf16 instead
        lm = _architecture(path) if on_meta else _from_pretrained(path)
    except OSError as exc:
        raise FileNotFoundError(f"could not load {what} {path!r}: {str(exc).splitlines()[0]}") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return lm, tokenizer


def _from_pretrained(path: str):
    return AutoModelForCausalLM.from_pretrained(path, use_safetensors=True, **{DTYPE_KEYWORD: torch.float32})


def _architecture(path: str):
    """The causal LM at ``path`` built from its config on the meta device, in fp32, with its generation config."""
    with torch.device("meta"):
        lm = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), **{DTYPE_KEYWORD: torch.float32})
    try:
        lm.generation_config = GenerationConfig.from_pretrained(path)
    except OSError:  # none saved: from_pretrained derives it from the config, as from_config did
        pass
    return lm


def source_dtype(model: str, cache_dir: Path) -> str:
    """The dtype a run's ``model`` came in (the dtype its trained policy downloads in unless fp32 is asked for): the
    dtype its config.json declares ("dtype", "torch_dtype" in older ones; float32 where it declares none, as
    transformers reads it), or a .gguf file's float type (grpo_engine.spec.gguf_header.gguf_float_dtype: bfloat16
    for a quantized file). One of SOURCE_DTYPES: another declared dtype (float64) counts as float32. The built-in
    model is float32."""
    if is_gguf(model):
        return gguf_float_dtype(Path(model).expanduser())
    config = AutoConfig.from_pretrained(resolve_model_path(model, cache_dir))
    declared = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    name = str(declared).removeprefix("torch.")
    return name if name in SOURCE_DTYPES else "float32"


def disable_dropout(model) -> None:
    """Turn off every dropout of ``model``: the ``nn.Dropout`` modules (GPT-2, Phi, ...) and the dropout
    rates that attention modules keep as numbers (``attention_dropout`` in Llama, Qwen2, Mistral, ...).

    GRPO compares log-probs of the same tokens under pi_theta, pi_old and pi_ref; with dropout on in the
    training forward they differ by noise alone (the ratio is not 1 at the first update, the clip fires for
    no reason, the KL is not 0 at the start), so peers train RL policies with dropout off.
    """
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for name, value in vars(module).items():
            if "dropout" in name and isinstance(value, float):
                setattr(module, name, 0.0)


def load_policy(
    model: str, cache_dir: Path, device: torch.device, log=print, progress=no_progress, phase=None, on_meta=False
):
    """(model, tokenizer) for a preset, a local directory, a .gguf file or a Hugging Face id, the model on ``device``
    (``on_meta``: on the meta device, without weights; see load_causal_lm).

    The tokenizer pads on the left (batched generation). ``progress`` and ``phase``: see resolve_model_path.
    """
    path = resolve_model_path(model, cache_dir, log=log, progress=progress, phase=phase)
    policy, tokenizer = load_causal_lm(path, on_meta=on_meta)
    tokenizer.padding_side = "left"
    return (policy if on_meta else policy.to(device)), tokenizer
