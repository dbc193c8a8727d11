"""Small local models of two standard architectures, with chat templates, for tests of real-model paths.

Random weights, the built-in tokenizer's vocabulary plus each family's chat special tokens:
  llama  LlamaConfig, a Llama-3-style template (<|start_header_id|>role<|end_header_id|> ... <|eot_id|>)
  qwen2  Qwen2Config, a ChatML template (<|im_start|>role ... <|im_end|>), as Qwen2 instruct models use
"""

from __future__ import annotations

from pathlib import Path

CHAT = {
    "llama": dict(
        special=["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        bos="<|begin_of_text|>",
        eos="<|eot_id|>",
        template=(
            "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
            "{{ m['content'] }}<|eot_id|>{% endfor %}"
            "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
        ),
    ),
    "qwen2": dict(
        special=["<|im_start|>", "<|im_end|>"],
        bos=None,
        eos="<|im_end|>",
        template=(
            "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
        ),
    ),
}


def write_tiny_model(out_dir: Path, arch: str, seed: int = 0, **sizes) -> Path:
    """A ~0.2M-parameter causal LM of ``arch`` ('llama' or 'qwen2') with its tokenizer, saved in safetensors.
    ``sizes``: config values over the tiny ones (hidden_size, num_hidden_layers, ...), for a bigger model."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    from grpo_engine.model.model import build_tokenizer

    chat = CHAT[arch]
    tokenizer = build_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": chat["special"]})
    tokenizer.eos_token = chat["eos"]
    if chat["bos"]:
        tokenizer.bos_token = chat["bos"]
    tokenizer.chat_template = chat["template"]
    size = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        tie_word_embeddings=arch == "qwen2",
    )
    size.update(sizes)
    config = LlamaConfig(**size) if arch == "llama" else Qwen2Config(**size)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir
