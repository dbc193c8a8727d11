"""How much memory a run's weights need, from parameter counts alone: one small function per job.

A GRPO run holds, on each of its devices (a data-parallel run holds all of it on every device; a sharded one,
sharding 'fsdp', holds 1 / devices of the policy, gradients, optimizer state and reference on each, and gathers
the whole policy once per sampling phase in the sampling dtype):

  policy        the trained weights, fp32 (precision only changes the forward passes: autocast)
  gradients     one fp32 gradient per trainable parameter
  optimizer     AdamW's two moments per trainable parameter: fp32 (optimizer 'adamw'), or 8-bit
                (optimizer 'adamw_8bit', bitsandbytes)
  reference     the frozen reference policy (bf16 when the run is bf16); none with LoRA, where the
                reference is the base model with the adapter switched off, nor with kl_coef 0 (no KL term)
  gathered      sharding 'fsdp' only: the whole policy gathered for sampling (bf16 when the run is bf16)
  reward_model  reward: model only: the RM's trained backbone with its gradients and AdamW state, and
                the frozen copy of its starting weights that gives the likelihood prior

Activations (the sampled outputs' KV cache, the forward and backward passes of the update) are NOT
counted: they grow with batch_size x group_size x max_new_tokens (micro_batch_size bounds the update's)
and come on top. The estimate is a lower bound, so a run refused for it cannot fit.

The counts come from the model directory's safetensors headers (:func:`count_parameters`, no torch,
so the web process can use it at launch) or, in the worker, from the loaded model. Pure Python: no torch.
Worked example (Qwen2.5-0.5B, 494,032,768 parameters, full fine-tune in bf16):
policy 1.98 GB, gradients 1.98 GB, optimizer state 3.95 GB, reference 0.99 GB, total 8.89 GB.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

FP32, BF16 = 4, 2  # bytes per value
ADAMW_STATES = 2  # AdamW keeps exp_avg and exp_avg_sq
# bytes a moment takes, by run-spec optimizer: fp32, or bitsandbytes' 8-bit block-wise quantization (its per-block
# scale, 4 bytes a block of 2,048 values, adds 0.2%, and tensors under 4,096 values keep fp32: both left out)
MOMENT_BYTES = {"adamw": FP32, "adamw_8bit": 1}
OUTPUT_HEADS = ("lm_head", "embed_out")  # a causal LM's output layer (Llama & co., GPT-NeoX): LoRA leaves it alone
EMBEDDINGS = ("wte", "wpe")  # GPT-2's token and position embeddings (others have "embed" in their name)
MAX_HEADER_BYTES = 100_000_000  # safetensors refuses longer headers too


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes each part of a run's weights takes (see the module docstring); activations not included."""

    policy: int  # the policy's weights: 4 bytes per parameter (fp32 weights; LoRA: base + adapter)
    gradients: int  # 4 bytes per trainable parameter
    optimizer: int  # AdamW: two moments, 8 bytes per trainable parameter in fp32, 2 in 8 bits
    reference: int  # the frozen reference: 0 with LoRA or kl_coef 0, else 2 bytes per parameter when bf16, else 4
    reward_model: int  # reward: model only: trained backbone + its gradients and AdamW + frozen prior copy
    gathered: int = 0  # sharding 'fsdp': the whole policy gathered for sampling, 2 bytes a parameter when bf16, else 4

    @property
    def total(self) -> int:
        return self.policy + self.gradients + self.optimizer + self.reference + self.reward_model + self.gathered

    def describe(self) -> str:
        """One line: 'policy 1.98 GB, gradients 1.98 GB, optimizer state 3.95 GB, reference 0.99 GB, total 8.89 GB'
        (the reference and the reward model left out when they take nothing)."""
        parts = [("policy", self.policy), ("gradients", self.gradients), ("optimizer state", self.optimizer)]
        parts += [
            (name, n)
            for name, n in (
                ("reference", self.reference),
                ("reward model", self.reward_model),
                ("gathered for sampling", self.gathered),
            )
            if n
        ]
        return ", ".join(f"{name} {gigabytes(n, self.total)}" for name, n in [*parts, ("total", self.total)])


def gigabytes(n: int, scale: int | None = None) -> str:
    """Bytes as decimal gigabytes (1 GB = 1e9 bytes), 2 decimals: 8_892_589_824 -> '8.89 GB'; as megabytes,
    1 decimal, when ``scale`` (default ``n``) is below 1 GB, so a small model is not '0.00 GB': 2_318_336 ->
    '2.3 MB'. One line's figures share the scale of its largest."""
    return f"{n / 1e9:.2f} GB" if (n if scale is None else scale) >= 1e9 else f"{n / 1e6:.1f} MB"


def estimate_memory(
    params: int,
    trainable: int,
    *,
    lora: bool,
    bf16: bool,
    rm_params: int = 0,
    reference: bool = True,
    optimizer: str = "adamw",
    shards: int = 1,
) -> MemoryEstimate:
    """The memory of a run's weights, gradients, optimizer state, reference and reward model.

    params: the policy's parameters (LoRA: base + adapter); trainable: those the optimizer updates (all of
    them in a full fine-tune, the adapter's with LoRA); lora: whether the run trains a LoRA adapter (then
    the reference costs nothing); bf16: whether the frozen copies are kept in bf16; rm_params: the learned
    reward model's backbone (0 with reward: rule); reference: False when the run keeps no reference at all
    (kl_coef 0); optimizer: the run spec's (the policy's moments in fp32 or 8 bits; a learned reward model keeps
    AdamW); shards: the processes a sharded run (sharding 'fsdp') splits the policy, gradients, optimizer state and
    reference across (1: not sharded).

      policy       = 4 * params
      gradients    = 4 * trainable
      optimizer    = 8 * trainable                          (AdamW: 2 fp32 moments; adamw_8bit: 2 * trainable)
      reference    = 0 (LoRA, or no reference), else (2 if bf16 else 4) * params
      reward_model = (4 + 4 + 8) * rm_params + (2 if bf16 else 4) * rm_params
      sharded (shards n > 1): policy, gradients, optimizer and reference / n (rounded up), and
      gathered    = (2 if bf16 else 4) * params    (the whole policy, once, for sampling)

    Example: 494,032,768 parameters, full fine-tune, bf16, no RM: 1.98 + 1.98 + 3.95 + 0.99 = 8.89 GB;
    with optimizer adamw_8bit the optimizer state is 0.99 GB instead of 3.95 GB (5.93 GB in all);
    the same with a rank-8 LoRA adapter (4,399,104 parameters on its 168 linear layers): 4 * 498,431,872 + 12 * 4,399,104 = 2.05 GB;
    the full fine-tune sharded across 4 processes: (1.98 + 1.98 + 3.95 + 0.99) / 4 + 0.99 gathered = 3.21 GB.
    """
    frozen = BF16 if bf16 else FP32

    def share(n: int) -> int:
        return -(-n // shards)

    return MemoryEstimate(
        policy=share(FP32 * params),
        gradients=share(FP32 * trainable),
        optimizer=share(ADAMW_STATES * MOMENT_BYTES[optimizer] * trainable),
        reference=0 if lora or not reference else share(frozen * params),
        reward_model=(FP32 + FP32 + ADAMW_STATES * FP32 + frozen) * rm_params,
        gathered=frozen * params if shards > 1 else 0,
    )


def too_big_message(
    estimate: MemoryEstimate, available: int, where: str, *, lora: bool = False, bf16: bool = False
) -> str:
    """Why a run does not fit in ``available`` bytes at ``where`` (e.g. 'the largest live GPU (NVIDIA A10G)'),
    naming the run-spec keys that make it smaller: lora_rank (unless the run already trains an adapter),
    precision (unless it is already bf16; only the frozen copies shrink), optimizer (unless its moments are already
    8-bit), model, and reward_model when
    a learned RM takes memory.

    Example: 'the run needs about 8.89 GB for its weights, gradients, optimizer state and reference (policy
    1.98 GB, ..., total 8.89 GB) but the largest live GPU has 8.00 GB; change lora_rank (...), optimizer
    (...) or model (a smaller model)'.
    """
    held = ["weights", "gradients", "optimizer state"]
    held += [name for name, n in (("reference", estimate.reference), ("reward model", estimate.reward_model)) if n]
    changes = []
    if not lora:
        changes.append("lora_rank (> 0 trains an adapter: no full gradients or optimizer state, no separate reference)")
    if not bf16 and (estimate.reference or estimate.reward_model):
        changes.append("precision ('bf16' keeps the frozen reference and reward-model prior in bf16)")
    if not lora and estimate.optimizer > estimate.gradients:  # fp32 moments: 8 bytes a trainable parameter, not 2
        changes.append("optimizer ('adamw_8bit' keeps AdamW's moments in 8 bits: a quarter of their memory)")
    changes.append("model (a smaller model)")
    if estimate.reward_model:
        changes.append("reward_model (a smaller reward model)")
    keys = f"{', '.join(changes[:-1])} or {changes[-1]}" if len(changes) > 1 else changes[0]
    return (
        f"the run needs about {gigabytes(estimate.total)} for its {', '.join(held[:-1])} and {held[-1]} "
        f"({estimate.describe()}) but {where} has {gigabytes(available)}; change {keys}"
    )


def lora_trainable_params(linear_shapes: list[tuple[int, int]], rank: int) -> int:
    """Parameters of a LoRA adapter of rank r on the given linear layers: sum over them of (in + out) * r.

    A layer W (out, in) gets A (r, in) and B (out, r). linear_shapes: the (out, in) shape of each targeted
    layer (order does not matter, so GPT-2's transposed Conv1D shapes count the same).
    Example: a 64 -> 128 layer and a 128 -> 64 layer at rank 4: (64 + 128) * 4 * 2 = 1536.
    """
    return sum((rows + cols) * rank for rows, cols in linear_shapes)


def _read_header(path: Path) -> dict:
    """The JSON header of a safetensors file: 8 bytes little-endian length, then that many bytes of JSON
    ({tensor name: {dtype, shape, data_offsets}, "__metadata__": {...}}). Reads only those bytes."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path.name} is not a safetensors file (shorter than its header length)")
        (length,) = struct.unpack("<Q", raw)
        if length > MAX_HEADER_BYTES:
            raise ValueError(f"{path.name} is not a safetensors file (header length {length})")
        text = f.read(length)
    if len(text) != length:
        raise ValueError(f"{path.name} is cut short: its header says {length} bytes")
    try:
        header = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError(f"{path.name} is not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path.name} is not a safetensors file (its header is not a JSON object)")
    return header


def _safetensors_files(model_dir: Path) -> list[Path]:
    """model.safetensors, or the shards model.safetensors.index.json lists; [] when neither is there."""
    single = model_dir / "model.safetensors"
    if single.is_file():
        return [single]
    index = model_dir / "model.safetensors.index.json"
    if not index.is_file():
        return []
    data = json.loads(index.read_text(encoding="utf-8"))
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    names = list(dict.fromkeys(weight_map.values())) if isinstance(weight_map, dict) else [None]
    if not all(isinstance(name, str) for name in names):
        raise ValueError(f"{index.name}: its weight_map must map tensor names to file names")
    root = model_dir.resolve()
    files = [(model_dir / name).resolve() for name in names]
    for file in files:
        if not file.is_relative_to(root):
            raise ValueError(f"{index.name} names a shard outside the model directory: {file}")
    return files


def _is_lora_target(name: str, shape: list[int]) -> bool:
    """Whether tensor ``name`` is the weight of a linear layer that peft's "all-linear" wraps: a 2-D
    ``*.weight`` that is neither an embedding (``embed`` in its module's name, or GPT-2's wte / wpe) nor
    the output head."""
    if len(shape) != 2 or not name.endswith(".weight"):
        return False
    module = name[: -len(".weight")].rsplit(".", 1)[-1]
    return "embed" not in module and module not in EMBEDDINGS and module not in OUTPUT_HEADS


def count_parameters(model_dir: str | Path) -> tuple[int, list[tuple[int, int]]] | None:
    """(total parameter count, the (out, in) shapes of the linear weights LoRA's "all-linear" wraps) of a
    Hugging Face model directory, from its safetensors headers only (a few kilobytes read, whatever the
    model's size). None when the directory has no model.safetensors nor model.safetensors.index.json.

    A tied output head is saved once (transformers drops the copy), so it counts once, as the loaded
    model's ``sum(p.numel() for p in model.parameters())`` does. Raises ValueError for a file that is
    not safetensors, OSError for one that cannot be read.
    """
    files = _safetensors_files(Path(model_dir))
    if not files:
        return None
    total, linear = 0, []
    for file in files:
        for name, info in _read_header(file).items():
            if name == "__metadata__":
                continue
            shape = info.get("shape") if isinstance(info, dict) else None
            if not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape):
                raise ValueError(f"{file.name}: tensor {name!r} has no valid shape")
            total += math.prod(shape)
            if _is_lora_target(name, shape):
                linear.append((shape[0], shape[1]))
    return total, linear


def memory_limit() -> int | None:
    """This process's cap on its writable memory in bytes (RLIMIT_DATA, which a worker sets from
    GRPO_WORKER_MEMORY_GB), or None where there is none."""
    try:
        import resource
    except ImportError:  # not a POSIX system
        return None
    soft = resource.getrlimit(resource.RLIMIT_DATA)[0]
    return None if soft == resource.RLIM_INFINITY else soft
