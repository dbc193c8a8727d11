"""How a failed run's error reads in its error field: one line, and for out-of-memory what to change."""

from __future__ import annotations

from grpo_engine.spec.memory import memory_limit


def one_line(exc: BaseException) -> str:
    """A readable one-line error for the run's error field: 'ValueError: first line of the message'.

    Out-of-memory errors say what to change."""
    text = str(exc).strip().splitlines()
    first = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    if is_out_of_memory(exc):
        limit = memory_limit()
        cap = f" This worker caps its memory at {limit / 2**30:.1f} GB (GRPO_WORKER_MEMORY_GB)." if limit else ""
        return (
            f"Out of memory ({first[:200]}). Set micro_batch_size (outputs per forward pass) or "
            "gradient_checkpointing, lower batch_size, group_size or max_new_tokens, or train a LoRA adapter "
            f"(lora_rank > 0).{cap}"
        )
    return first


def limit_memory(gigabytes: float) -> None:
    """Cap this process's writable memory at ``gigabytes`` (RLIMIT_DATA's soft limit; a run's data-parallel
    processes inherit it). An allocation past it fails with the allocator's out-of-memory error, so the run
    fails with the message above instead of the machine's OOM killer ending the worker. GPU memory is not
    counted; CUDA's host-side mappings are."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
    limit = int(gigabytes * 2**30)
    resource.setrlimit(resource.RLIMIT_DATA, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))


def is_out_of_memory(exc: BaseException) -> bool:
    """torch.OutOfMemoryError (CUDA; named, so torch is not imported here), MemoryError, or the CPU
    allocator's RuntimeError."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    return isinstance(exc, RuntimeError) and (
        "out of memory" in str(exc).lower() or "can't allocate memory" in str(exc)
    )
