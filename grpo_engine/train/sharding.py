"""A run with ``sharding: fsdp``: the policy (and the frozen reference) fully sharded across the run's processes.

torch's FSDP2 (``torch.distributed.fsdp.fully_shard``, the engine behind Accelerate's FSDP plugin version 2) shards
each decoder layer and then the model's root (embeddings, final norm, output head): every process keeps 1 / n of each
parameter, of its gradient and of the optimizer's moments, as DTensors. A forward all-gathers one layer at a time and
frees it after; a backward reduce-scatters the gradients (averaged over the processes, as data parallelism averages
them). ``fully_shard`` is called here, with Accelerate only placing the processes: Accelerate's FSDP plugin is skipped
on the CPU (it falls back to data parallelism there), and one code path for the CPU and the GPU is one tested path.

Decoding. A sharded forward all-gathers every layer, so every process would have to make exactly as many forwards
as every other; a sampler that stops when its own outputs have ended would hang the others. The sampler therefore
decodes inside :func:`gathered`: the parameters are all-gathered once, kept for the phase's forwards (which then make
no collective call, so each process decodes as far as its own outputs need) and freed after. They are gathered in the
sampling dtype: bf16 on a GPU with bf16 (the MixedPrecisionPolicy below), so no process holds a full fp32 copy; fp32
on the CPU, which samples in fp32 (faster there, see placement.Precision).

Checkpoints: the sharded policy, optimizer and reference through torch's distributed checkpoint API (each process
writes its shards, :func:`save_sharded` / :func:`load_sharded`); the final policy is gathered onto the main process
and saved as one ordinary Hugging Face directory (:func:`full_state_dict`). A checkpoint's policy is read back whole
in one process by :func:`read_policy_alone`.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

SHARDED_DIR = "sharded"  # a checkpoint's sub-directory of distributed-checkpoint shards


def decoder_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks, each sharded on its own: the modules whose class the model names in
    ``_no_split_modules`` (transformers' decoder layers: LlamaDecoderLayer, Qwen2DecoderLayer, GPT2Block; the same
    list Accelerate's automatic FSDP wrapping reads), looked up through a LoRA wrapper."""
    names: set[str] = set()
    for m in model.modules():
        names.update(getattr(m, "_no_split_modules", None) or [])
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if not blocks:
        raise ValueError(
            f"sharding: {type(model).__name__} names no decoder layer (_no_split_modules) to shard; use sharding 'none'"
        )
    return blocks


def shard(
    model: torch.nn.Module, device: torch.device, processes: int, bf16_params: bool, from_main: bool = False
) -> torch.nn.Module:
    """``model`` fully sharded in place across the ``processes`` of the run (the default process group, which
    Accelerate started): each decoder block, then the root, each unit's share moved to ``device`` as it is sharded
    (a model loaded into the CPU's memory is never whole on the GPU). ``bf16_params``: forwards and backwards run on bf16
    copies of the gathered parameters, gradients reduced in fp32 (a GPU run in bf16 mixed precision); the shards, the
    gradients' and the optimizer's stay fp32. ``from_main``: only the main process holds the weights, the others'
    ``model`` is on the meta device (loading.load_policy_once); it is sharded there, given storage, and each
    process's shards are filled from the main process's whole tensors, one tensor at a time, with the buffers
    (rotary embeddings' frequencies, which no state dict holds). Each unit's parameters are gathered and freed once
    here, one unit at a time (never the whole model at once), outside inference mode, so that the buffers they are
    gathered into are ordinary tensors (a sampler's inference-mode forward would otherwise create them, and the
    update could not write them)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    on_meta = any(p.is_meta for p in model.parameters())
    whole = model.state_dict() if from_main and not on_meta else {}  # the main process's tensors, kept until sent
    mesh = init_device_mesh(device.type, (processes,))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16_params else None
    kwargs = {"mesh": mesh, **({"mp_policy": policy} if policy is not None else {})}
    for block in decoder_blocks(model):
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    if from_main:
        if on_meta:
            model.to_empty(device=device)
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(model, whole, options=options)
        del whole
        with torch.no_grad():
            for buffer in model.buffers():
                torch.distributed.broadcast(buffer, src=0)
    for unit in fsdp_modules(model):
        unit.unshard()
        unit.reshard()
    return model


def fsdp_modules(model: torch.nn.Module) -> list:
    """The sharded units of ``model`` (empty when it is not sharded)."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextmanager
def gathered(model: torch.nn.Module) -> Iterator[None]:
    """For the body, ``model``'s parameters all-gathered (once: every process must enter together) and kept, so that
    its forwards make no collective call and each process may make as many as it needs; freed again after. A model
    that is not sharded is left as it is."""
    units = fsdp_modules(model)
    if not units:
        yield
        return
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
        unit.unshard()
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(True, recurse=False)


def local_value(t: torch.Tensor) -> float:
    """A scalar tensor's value, whole: a DTensor (a sharded model's gradient norm) is gathered first."""
    return float(t.full_tensor() if hasattr(t, "full_tensor") else t)


def full_state_dict(model: torch.nn.Module, everywhere: bool = False) -> dict[str, torch.Tensor]:
    """Every process calls it: the sharded ``model``'s whole state dict, on the CPU, on the main process ({} on the
    others; on every process with ``everywhere``): the final policy's weights, saved as one ordinary model
    directory, or a LoRA run's, whose adapter every process folds into its base at a reference reset."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if everywhere:  # one tensor at a time gathered on the device and copied to the CPU: never the whole model there
        return {
            k: (v.full_tensor() if hasattr(v, "full_tensor") else v).cpu()
            for k, v in get_model_state_dict(model).items()
        }
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def save_sharded(directory: Path, policy, optimizer, reference) -> None:
    """Every process calls it: the sharded policy, its optimizer's state and the reference (None: not saved) written
    to ``directory`` through torch's distributed checkpoint API, each process its own shards."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    state = {"policy": get_model_state_dict(policy), "optimizer": get_optimizer_state_dict(policy, optimizer)}
    if reference is not None:
        state["reference"] = get_model_state_dict(reference)
    dcp.save(state, checkpoint_id=str(directory))


def load_sharded(directory: Path, policy, optimizer, reference) -> None:
    """Every process calls it: :func:`save_sharded`'s state read back into the freshly sharded ``policy``,
    ``optimizer`` and ``reference`` (None: the checkpoint holds none to read)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    state = {"policy": get_model_state_dict(policy), "optimizer": get_optimizer_state_dict(policy, optimizer)}
    if reference is not None:
        state["reference"] = get_model_state_dict(reference)
    dcp.load(state, checkpoint_id=str(directory))
    set_model_state_dict(policy, state["policy"])
    set_optimizer_state_dict(policy, optimizer, state["optimizer"])
    if reference is not None:
        set_model_state_dict(reference, state["reference"])


def read_policy_alone(directory: Path, policy) -> None:
    """In one process, with no process group: the policy of :func:`save_sharded`'s shards read into ``policy``, an
    unsharded model built as the run built it (LoRA-wrapped for a LoRA run), each tensor made whole from every
    process's shard. What a checkpoint of a sharded run needs to become a model (``model: run:<id>@<step>``)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    state = {"policy": get_model_state_dict(policy)}  # the names save_sharded wrote
    with warnings.catch_warnings():  # "torch.distributed is ... uninitialized": one process is meant here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=str(directory), no_dist=True)
    set_model_state_dict(policy, state["policy"])
