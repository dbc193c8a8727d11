"""Checkpoints of a GRPO run, so a run whose worker died resumes where it was.

Each attempt at a run (its first start, then each resumption) writes into a directory of its own,
``<run dir>/attempt-<n, 6 digits>``, which it opens with :func:`begin_attempt`. Opening attempt n first seals the
attempts before it: their directories are renamed ``sealed-<n>``, which no one writes again. A process of an earlier
attempt that outlived its worker (killed half-way through a save) can then never touch what a resumption reads or
writes: its rename into ``attempt-<old>/step-...`` finds no such directory, and a directory it makes again under
that name is a stale one the next :func:`begin_attempt` deletes. The resumption reads the newest complete
checkpoint among the sealed directories; the others are deleted.

A checkpoint is a directory ``<attempt dir>/step-<step, 8 digits>`` holding everything the training
loop needs to continue as if it had never stopped:

    policy.safetensors        the policy's weights: all of them, or with LoRA in the first iteration
                              only the adapter's (the base is still the starting model then)
    optimizer.safetensors     the optimizer's tensors: AdamW's exp_avg, exp_avg_sq (and step) per parameter;
                              AdamW8bit's 8-bit codes, block scales and code maps
    reference.safetensors     the reference policy, when it is no longer the starting model
                              (full fine-tune after the first reference reset)
    reward_model.safetensors  the learned reward model's trained weights (reward: model)
    rng.safetensors           torch's random states (CPU, and each CUDA device); in a data-parallel
                              run also every process's own (rank<r>.torch, rank<r>.cuda)
    sharded/                  instead of the three above in a sharded run (sharding 'fsdp'): the policy, optimizer
                              and reference as torch distributed-checkpoint shards, one file per process
    state.json                step, iteration, Python random states, optimizer hyperparameters, the
                              reward model's labelled history; written last

Tensors are stored with safetensors only (no pickle is ever loaded). A checkpoint is written to a
temporary directory and renamed into place, so a worker killed while saving leaves no half
checkpoint behind; the newest ``keep`` are kept. ``final/`` (``save_final``) holds the policy at
the end of the run as a Hugging Face model directory, in fp32, with the dtype the model came in.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, load_model, save_file, save_model

from grpo_engine.model.model import load_policy, source_dtype
from grpo_engine.report.run_files import FINAL_INFO, STATE_FILE, attempts, complete, step_dirs
from grpo_engine.train.loading import wrap_lora
from grpo_engine.train.sharding import SHARDED_DIR, load_sharded, read_policy_alone

FORMAT = 1


def _random_state_to_json(state: tuple) -> list:
    """random.Random.getstate() as JSON: (version, 625 ints, gauss) -> [version, [ints], gauss]."""
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _random_state_from_json(value: list) -> tuple:
    return value[0], tuple(value[1]), value[2]


def _trainable(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The parameters that train, by name, as contiguous CPU tensors."""
    return {n: p.detach().contiguous().cpu() for n, p in module.named_parameters() if p.requires_grad}


def _optimizer_tensors(optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """An optimizer's state_dict split into tensors ("state.<param index>.<key>", and "state.<param index>.<key>/<sub
    key>" for a dict of tensors in a parameter's state, as bitsandbytes keeps its 8-bit state) and the JSON rest."""
    sd = optimizer.state_dict()
    tensors, scalars = {}, {}
    for index, state in sd["state"].items():
        for key, value in state.items():
            if torch.is_tensor(value):
                tensors[f"state.{index}.{key}"] = value.detach().contiguous().cpu()
            elif isinstance(value, dict) and value and all(torch.is_tensor(v) for v in value.values()):
                for sub, tensor in value.items():  # cloned: bitsandbytes shares its code maps between parameters
                    tensors[f"state.{index}.{key}/{sub}"] = tensor.detach().cpu().clone()
            else:
                scalars[f"{index}.{key}"] = value
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def _load_optimizer(optimizer, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        _, index, key = name.split(".", 2)
        if "/" in key:  # a dict of tensors in the parameter's state
            key, sub = key.split("/", 1)
            state.setdefault(int(index), {}).setdefault(key, {})[sub] = value
        else:
            state.setdefault(int(index), {})[key] = value
    for name, value in meta["scalars"].items():
        index, key = name.split(".", 1)
        state.setdefault(int(index), {})[key] = value
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


def latest(run_dir: Path) -> tuple[int, Path] | None:
    """(step, directory) of the newest complete checkpoint, or None."""
    found = step_dirs(run_dir)
    return found[-1] if found else None


def begin_attempt(run_dir: Path) -> Path:
    """Open a new attempt's directory under ``run_dir`` (made; returned) after sealing the attempts before it.

    Only the latest attempt's directory can be a live one to seal: an ``attempt-<k>`` below the newest number seen
    was made again by a process of attempt k after a later attempt sealed it (or began), and is deleted. Sealed
    directories other than the one holding the newest complete checkpoint, which the new attempt resumes from,
    are deleted. Checkpoints at the top of ``run_dir`` (saved before attempts had directories) are sealed as attempt
    0 first. Called by one process of the run (the main one), which holds the run's lease."""
    run_dir.mkdir(parents=True, exist_ok=True)
    legacy = complete(run_dir)  # step directories at the top: a run saved by a version before attempts
    if legacy:
        (run_dir / "sealed-000000").mkdir(exist_ok=True)
        for _, path in legacy:
            path.rename(run_dir / "sealed-000000" / path.name)
    found = attempts(run_dir)
    newest = max((number for number, _, _ in found), default=0)
    for number, kind, path in found:
        if kind == "attempt" and number == newest:
            path.rename(run_dir / f"sealed-{number:06d}")
        elif kind == "attempt":
            shutil.rmtree(path, ignore_errors=True)
    kept = latest(run_dir)
    for _, _, path in attempts(run_dir):
        if kept is None or path != kept[1].parent:
            shutil.rmtree(path, ignore_errors=True)
    attempt = run_dir / f"attempt-{newest + 1:06d}"
    attempt.mkdir()  # exclusive: a second opener of the same number fails here instead of sharing it
    return attempt


def clear(run_dir: Path) -> None:
    """Delete every attempt's checkpoints under ``run_dir`` (a completed run keeps only ``final/``)."""
    for _, _, path in attempts(run_dir):
        shutil.rmtree(path, ignore_errors=True)


def process_random_state() -> dict[str, torch.Tensor]:
    """This process's torch random states: the CPU generator's and, with CUDA, the current device's.
    The processes of a data-parallel run each sample with their own; see ``save(process_states=)``."""
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def temp_dir(attempt_dir: Path, step: int) -> Path:
    """A fresh directory for the checkpoint after ``step``, beside where :func:`save` renames it to."""
    attempt_dir.mkdir(parents=True, exist_ok=True)
    tmp = attempt_dir / f".tmp-step-{step:08d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    return tmp


def save(
    attempt_dir: Path,
    *,
    step: int,
    iteration: int,
    policy,
    optimizer,
    reference,
    lora: bool,
    rng,
    rm=None,
    rm_rng=None,
    rm_history=None,
    keep: int = 2,
    process_states: list[dict[str, torch.Tensor]] | None = None,
    sharded: Path | None = None,
) -> Path:
    """Write the checkpoint after ``step`` into this attempt's directory (:func:`begin_attempt`) and keep only its
    newest ``keep`` there. Returns its directory. Where a later attempt sealed ``attempt_dir`` meanwhile, the final
    rename fails (FileNotFoundError) and nothing of it is kept.

    ``policy`` and ``reference`` are unwrapped modules (``reference`` None: LoRA, or still the starting
    model); ``rng`` / ``rm_rng`` are the loop's random.Random objects. ``process_states``: in a
    data-parallel run, ``process_random_state()`` of every process (index = process rank); the main
    process saves the checkpoint, and each process restores its own states from it. ``sharded``: a sharded run's
    :func:`temp_dir`, whose ``sharded/`` every process has written (sharding.save_sharded: the policy, optimizer and
    reference); the rest is written beside it.
    """
    final = attempt_dir / f"step-{step:08d}"
    tmp = sharded or temp_dir(attempt_dir, step)

    # 1. weights: with LoRA in iteration 1 the base is the starting model, so the adapter is enough
    adapter_only = lora and iteration == 1 and sharded is None
    if sharded is None and adapter_only:
        save_file(_trainable(policy), tmp / "policy.safetensors")
    elif sharded is None:
        save_model(policy, str(tmp / "policy.safetensors"))  # handles tied weights
    if reference is not None and sharded is None:
        save_model(reference, str(tmp / "reference.safetensors"))
    if rm is not None:
        save_file(_trainable(rm), tmp / "reward_model.safetensors")

    # 2. optimizer and random states
    opt_meta = None
    if sharded is None:
        opt_tensors, opt_meta = _optimizer_tensors(optimizer)
        save_file(opt_tensors, tmp / "optimizer.safetensors")
    rng_tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            rng_tensors[f"cuda.{i}"] = state
    for rank, states in enumerate(process_states or []):
        rng_tensors.update({f"rank{rank}.{name}": value for name, value in states.items()})
    save_file(rng_tensors, tmp / "rng.safetensors")

    # 3. state.json last: its presence marks the checkpoint complete
    state = {
        "format": FORMAT,
        "step": step,
        "iteration": iteration,
        "adapter_only": adapter_only,
        "has_reference": reference is not None,
        "sharded": sharded is not None,
        "optimizer": opt_meta,
        "rng": _random_state_to_json(rng.getstate()),
        "rm_rng": _random_state_to_json(rm_rng.getstate()) if rm_rng is not None else None,
        "rm_history": [asdict(e) for e in rm_history] if rm_history is not None else None,
    }
    (tmp / STATE_FILE).write_text(json.dumps(state))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for _, old in complete(attempt_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def read_state(checkpoint: Path) -> dict[str, Any]:
    """The checkpoint's state.json (step, iteration, ...)."""
    state = json.loads((checkpoint / STATE_FILE).read_text())
    if state.get("format") != FORMAT:
        raise ValueError(f"checkpoint {checkpoint}: format {state.get('format')!r}, this version reads {FORMAT}")
    return state


def load(
    checkpoint: Path, state: dict[str, Any], *, policy, optimizer, reference, rng, rm=None, rm_rng=None, rank: int = 0
) -> None:
    """Restore a checkpoint into the freshly built ``policy`` / ``optimizer`` / ``reference`` / ``rm``
    (the same shapes as when it was saved) and the random states (``rank``: this process's in a
    data-parallel run). A sharded checkpoint's policy, optimizer and reference are read by every process from its
    shards."""
    device = next(policy.parameters()).device
    if state.get("sharded"):
        load_sharded(checkpoint / SHARDED_DIR, policy, optimizer, reference if state["has_reference"] else None)
    else:
        load_policy_weights(checkpoint, state, policy)
    if state["has_reference"] and not state.get("sharded"):
        if reference is None:
            raise ValueError(f"checkpoint {checkpoint} has a reference policy but this run keeps none")
        load_model(reference, str(checkpoint / "reference.safetensors"), device=str(device))
    if rm is not None:
        rm.load_state_dict(load_file(checkpoint / "reward_model.safetensors", device=str(rm.device)), strict=False)
    if not state.get("sharded"):
        _load_optimizer(optimizer, load_file(checkpoint / "optimizer.safetensors"), state["optimizer"])
    rng_tensors = load_file(checkpoint / "rng.safetensors")
    torch.set_rng_state(rng_tensors["torch"])
    cuda = [rng_tensors[f"cuda.{i}"] for i in range(sum(k.startswith("cuda.") for k in rng_tensors))]
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    if rank > 0:
        if f"rank{rank}.torch" not in rng_tensors:
            raise ValueError(f"checkpoint {checkpoint} holds no random state for process {rank}")
        torch.set_rng_state(rng_tensors[f"rank{rank}.torch"])
        if f"rank{rank}.cuda" in rng_tensors and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng_tensors[f"rank{rank}.cuda"])
    rng.setstate(_random_state_from_json(state["rng"]))
    if rm_rng is not None and state["rm_rng"] is not None:
        rm_rng.setstate(_random_state_from_json(state["rm_rng"]))


def load_policy_weights(checkpoint: Path, state: dict[str, Any], policy) -> None:
    """The policy's weights of an unsharded checkpoint into ``policy``, built as the run built it (LoRA-wrapped
    for a LoRA run): the adapter alone where the checkpoint holds only it, else every weight."""
    device = next(policy.parameters()).device
    if state["adapter_only"]:
        _, unexpected = policy.load_state_dict(
            load_file(checkpoint / "policy.safetensors", device=str(device)), strict=False
        )
        if unexpected:
            raise ValueError(f"checkpoint {checkpoint}: unexpected adapter weights {unexpected[:3]}")
    else:
        load_model(policy, str(checkpoint / "policy.safetensors"), device=str(device))


def save_policy_at(spec, checkpoint: Path, out_dir: Path, cache_dir: Path, log=print) -> None:
    """The policy of ``checkpoint``, saved by a run of ``spec`` (its model already a path or a name this machine
    loads), as :func:`save_final` writes a trained policy, into ``out_dir`` (grpo_engine.report.run_files
    .policy_at_dir's parent): the run's starting model built again on the CPU, wrapped in LoRA as it trained,
    the checkpoint's weights read into it, merged. What ``model: run:<id>@<step>`` loads. A sharded checkpoint's
    (sharding 'fsdp') policy is made whole from its processes' shards."""
    state = read_state(checkpoint)
    log(f"reading the policy of checkpoint {checkpoint.name} (step {state['step']}) into a model directory")
    policy, tokenizer = load_policy(spec.model, cache_dir, torch.device("cpu"), log=log)
    if spec.lora_rank > 0:
        policy = wrap_lora(policy, spec.lora_rank)
    if state.get("sharded"):
        read_policy_alone(checkpoint / SHARDED_DIR, policy)
    else:
        load_policy_weights(checkpoint, state, policy)
    save_final(out_dir, policy, tokenizer, spec.lora_rank > 0, source_dtype(spec.model, cache_dir))


def save_final(out_dir: Path, policy, tokenizer, lora: bool, source_dtype: str = "float32") -> None:
    """The trained policy as Hugging Face model directories: ``model/`` (LoRA merged into the base)
    and, for LoRA, ``adapter/`` (the adapter alone, for peft), both in the dtype it trained in (fp32), and
    ``policy.json``: ``{"source_dtype": ...}``, the dtype the model came in (model.source_dtype), which the
    dashboard's download converts ``model/`` to unless fp32 is asked for (app.service.exports). Written aside,
    then renamed into place.

    With LoRA the adapter is merged into ``policy`` in place (the run is over; no second copy)."""
    tmp = out_dir.with_name(out_dir.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if lora:
        policy.save_pretrained(tmp / "adapter", safe_serialization=True)
        tokenizer.save_pretrained(tmp / "adapter")
        merged = policy.merge_and_unload()
    else:
        merged = policy
    merged.save_pretrained(tmp / "model", safe_serialization=True)
    tokenizer.save_pretrained(tmp / "model")
    (tmp / FINAL_INFO).write_text(json.dumps({"source_dtype": source_dtype}) + "\n")
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
