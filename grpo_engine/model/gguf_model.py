"""A local .gguf file (llama.cpp's format, often quantized) as a run's model: converted once into an ordinary
Hugging Face model directory in the model cache.

transformers reads a .gguf file (``from_pretrained(directory, gguf_file=name)``, the weights dequantized to fp32
here), but the model it gives keeps the GGUF quantizer in its config and refuses ``save_pretrained``: a run could
not write its checkpoints nor its trained policy, and every load would dequantize the file again (about 30 s for
a 135M model on 2 CPU cores). So the file is converted once: the architecture is built from the file's config
without its quantization entry, the dequantized weights are loaded into it, and it is saved with the file's
tokenizer (its chat template and EOS) and generation config (its end tokens) as an ordinary directory
(config.json, model.safetensors, tokenizer files) under ``cache_dir/gguf/<key>``. The key follows the file's
resolved path, size and modification time, so a file that changes converts again. Everything after that (the
policy, the reward model, a label completer, checkpoints, the exported policy) reads that directory.

The conversion holds the weights twice in fp32 while it copies them (about 1.1 GB for 135M parameters).
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_engine.model.model_cache import DTYPE_KEYWORD, build_once
from grpo_engine.spec.gguf_header import converted_dir

try:  # transformers 5 may keep a GGUF's weights in their blocks; asked to, it unpacks every one
    from transformers import GgufConfig
except ImportError:  # older: a .gguf file is always dequantized
    GgufConfig = None

CONVERTING = "converting the .gguf model (once)"  # the run's phase while its .gguf file converts


def gguf_model_dir(path: str | Path, cache_dir: Path, log=print, phase=None) -> Path:
    """The converted model directory of the .gguf file at ``path``, converted on first use (safe across
    processes: grpo_engine.model.model_cache). A conversion logs its start and how long it took, and reports
    ``phase(CONVERTING)`` before it and ``phase("loading model")`` after it (a run's recorder shows them as the
    run's phase).

    Raises FileNotFoundError where ``path`` is not a file.
    """
    source = Path(path).expanduser().resolve()
    if not source.is_file():
        raise FileNotFoundError(
            f"GGUF file {str(path)!r} does not exist"
            if not source.exists()
            else f"{str(path)!r} is not a GGUF file but a directory"
        )
    target = converted_dir(source, cache_dir)
    start = time.monotonic()

    def build(tmp: Path) -> None:
        if phase is not None:
            phase(CONVERTING)
        log(f"converting {source.name} into a model directory (first use of this file only)")
        convert_gguf(source, tmp)

    if build_once(
        target,
        target.with_name(f".{target.name}.lock"),
        build,
        missing=f"the conversion of {source.name} wrote no weights",
    ):
        log(f"converted {source.name} in {time.monotonic() - start:.0f}s into {target}")
        if phase is not None:
            phase("loading model")
    return target


def convert_gguf(source: Path, out_dir: Path) -> None:
    """Write the .gguf file ``source`` to ``out_dir`` as an ordinary model directory (fp32 weights in safetensors,
    its config without the quantization entry, its generation config and its tokenizer); a tokenizer whose chat
    template or EOS does not read back the same from ``out_dir`` raises ValueError."""
    where = {"gguf_file": source.name}
    tokenizer = AutoTokenizer.from_pretrained(source.parent, **where)
    unpack = {"quantization_config": GgufConfig(dequantize=True)} if GgufConfig is not None else {}
    loaded = AutoModelForCausalLM.from_pretrained(source.parent, **where, **unpack, **{DTYPE_KEYWORD: torch.float32})
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # kept, it would load the saved directory through the GGUF quantizer again
    model = AutoModelForCausalLM.from_config(config).float()
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = copy.deepcopy(loaded.generation_config)
    del loaded
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    saved = AutoTokenizer.from_pretrained(out_dir)
    for attr in ("chat_template", "eos_token"):
        if getattr(saved, attr, None) != getattr(tokenizer, attr, None):
            raise ValueError(f"{source.name}: the converted tokenizer's {attr} differs from the file's")
