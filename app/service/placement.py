"""Where the live workers can take a run: launch's own admission checks (app.core.admission.admit calls
:func:`check_placement`; the worker checks its own machine when it loads the run).

A run is refused, naming the key to change, when the workers that would take it cannot: a ``device: gpu`` run when
none of them has a GPU (``device``), a run of several processes when none has a GPU for each (``devices``), a local
model whose weights, gradients, optimizer state and reference fit no GPU of theirs (``model``). With no such worker
known, a run is accepted and waits for one. Live workers: those that reported within 2 x GRPO_LEASE_SECONDS.
"""

from __future__ import annotations

from pathlib import Path

from app import store
from app.core.broker import queue_for
from app.core.paths import is_local_path
from app.core.settings import get_settings
from app.store.db import session_scope
from grpo_engine.spec.config import SpecError, is_gguf
from grpo_engine.spec.gguf_header import gguf_parameter_counts
from grpo_engine.spec.memory import (
    MemoryEstimate,
    count_parameters,
    estimate_memory,
    lora_trainable_params,
    too_big_message,
)


def check_placement(config: dict) -> None:
    """Launch's own admission checks: where the live workers can take the run (app.core.admission.admit calls it)."""
    check_gpu_worker(config)  # a 'gpu' run is not handed to workers that have no GPU
    check_enough_gpus(config)  # a GPU for each of its processes on one live worker that would take it
    check_fits_a_gpu(config)  # its weights fit a GPU of the live workers that would take it


def _takers(device: str) -> list[dict]:
    """The live workers (reported within 2 x GRPO_LEASE_SECONDS) that consume the queue of runs with ``device``."""
    settings = get_settings()
    queue = queue_for(device, settings.queue)
    with session_scope() as s:
        return [w for w in store.live_workers(s, 2 * settings.lease_seconds) if queue in w["queues"]]


def _gpu_takers(device: str) -> list[dict]:
    """The live workers with GPUs that would take a run with ``device`` ('gpu' or 'auto') on them; [] when the run
    may go elsewhere: no GPU worker is known (it waits for one), or ``auto`` and a CPU worker may take it."""
    workers = _takers(device)
    gpu_workers = [w for w in workers if w["gpus"]]
    return [] if device == "auto" and len(gpu_workers) < len(workers) else gpu_workers


def _local_counts(value: str) -> tuple[int, list[tuple[int, int]]] | None:
    """count_parameters of a local model directory, or of a .gguf file from its header (the fp32 weights the run
    trains, whatever the file's quantization); None for the built-in model, a Hugging Face id, a directory without
    safetensors or a file whose headers do not read (the worker reports that when it loads it)."""
    if not is_local_path(value):
        return None
    try:
        if is_gguf(value):
            return gguf_parameter_counts(Path(value).expanduser().resolve())
        return count_parameters(Path(value).expanduser().resolve())
    except (OSError, ValueError):
        return None


def estimate_run_memory(config: dict, bf16: bool) -> MemoryEstimate | None:
    """The memory of a validated run spec's weights (grpo_engine.spec.memory), when its ``model`` is a local
    directory with safetensors or a .gguf file; else None. The reward model (reward: model) is the policy's
    weights when ``reward_model`` is empty, or a local directory or .gguf file; a Hugging Face id there is left
    out (the estimate is then a lower bound)."""
    counts = _local_counts(config["model"])
    if counts is None:
        return None
    params, linear = counts
    rank = config["lora_rank"]
    adapter = lora_trainable_params(linear, rank) if rank else 0
    rm_params = 0
    if config["reward"] == "model":
        rm_counts = _local_counts(config["reward_model"]) if config["reward_model"] else counts
        rm_params = rm_counts[0] if rm_counts else 0
    return estimate_memory(
        params + adapter,
        adapter if rank else params,
        lora=rank > 0,
        bf16=bf16,
        rm_params=rm_params,
        reference=config["kl_coef"] > 0,
        optimizer=config["optimizer"],
        shards=config["devices"] if config["sharding"] == "fsdp" else 1,
    )


def check_gpu_worker(config: dict) -> None:
    """Refuse a ``device: gpu`` run (SpecError naming ``device``) when the live workers that take 'gpu' runs
    have no GPU among them: they would take it and fail it at once. Today that is the embedded worker on a
    machine without a CUDA GPU, which takes every kind of run.

    When no live worker takes 'gpu' runs (none reported yet, or only CPU workers of a separate broker, which
    leave them on the queue), the run is accepted and waits for a GPU worker.
    """
    if config["device"] != "gpu":
        return
    settings = get_settings()
    takers = _takers("gpu")
    if not takers or any(w["gpus"] for w in takers):
        return
    if settings.embedded_worker:
        why = "the embedded worker runs on this machine's CPU"
    else:
        why = f"the workers that take 'gpu' runs have none: {', '.join(w['name'] for w in takers)}"
    raise SpecError(
        "device",
        f"'gpu' but no live worker has a GPU ({why}); use device 'auto' or 'cpu', or "
        "start `grpo-dashboard worker` on a GPU machine",
    )


def check_enough_gpus(config: dict) -> None:
    """Refuse (SpecError naming ``devices``) a run of several processes that would train on GPUs, one GPU each, when
    no live worker that would take it has that many: ``device: gpu``, or ``auto`` when every live worker that takes
    it has GPUs. A CPU run's processes share its worker's cores, whatever their number; with no GPU worker known the
    run is accepted and waits for one."""
    if config["devices"] == 1 or config["device"] == "cpu":
        return
    gpu_workers = _gpu_takers(config["device"])
    if not gpu_workers:
        return
    most = max(gpu_workers, key=lambda w: len(w["gpus"]))
    if len(most["gpus"]) < config["devices"]:
        raise SpecError(
            "devices",
            f"{config['devices']} processes need {config['devices']} GPUs on one worker, but the live workers that "
            f"would take the run have at most {len(most['gpus'])} ({most['name']}); lower devices, or start "
            f"`grpo-dashboard worker` on a machine with {config['devices']} GPUs",
        )


def check_fits_a_gpu(config: dict) -> None:
    """Refuse a run whose weights, gradients, optimizer state, reference and reward model (activations
    aside) need more memory than any GPU of the live workers that would take it has: SpecError naming
    ``model``, with the keys that make the run smaller.

    Live workers: those that reported within 2 x GRPO_LEASE_SECONDS and consume the run's queue. A
    ``device: gpu`` run is refused when none of their GPUs is big enough; a ``device: auto`` run only when
    every one of them has a GPU and none is big enough (a CPU worker may take it); a ``device: cpu`` run,
    or any run when no GPU worker is known, is accepted. bf16 unless ``precision`` is 'fp32' ('auto' is
    bf16 on a GPU). Only local models are measured, from their safetensors or GGUF headers: the
    built-in model is tiny, and a Hugging Face id is not fetched here (it may be large, or the dashboard
    offline); the worker checks those when it loads them.
    """
    if config["device"] == "cpu":
        return
    gpu_workers = _gpu_takers(config["device"])
    if not gpu_workers:
        return
    bf16 = config["precision"] != "fp32"
    need = estimate_run_memory(config, bf16)
    if need is None:
        return
    worker, gpu = max(((w["name"], g) for w in gpu_workers for g in w["gpus"]), key=lambda wg: wg[1]["memory"])
    if need.total > gpu["memory"]:
        where = f"the largest GPU of the live workers ({gpu['name']} on {worker})"
        raise SpecError("model", too_big_message(need, gpu["memory"], where, lora=config["lora_rank"] > 0, bf16=bf16))
