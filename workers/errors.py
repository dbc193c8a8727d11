"""How a failed run's error reads in its error field: one line, and for out-of-memory what to change."""
from __future__ import annotations


def one_line(exc: BaseException) -> str:
    """A readable one-line error for the run's error field: 'ValueError: first line of the message'.

    Out-of-memory errors say what to change."""
    text = str(exc).strip().splitlines()
    first = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    if is_out_of_memory(exc):
        return (f"Out of memory ({first[:200]}). Set micro_batch_size (outputs per forward pass) or "
                "gradient_checkpointing, lower batch_size, group_size or max_new_tokens, or train a LoRA adapter "
                "(lora_rank > 0).")
    return first


def is_out_of_memory(exc: BaseException) -> bool:
    """torch.OutOfMemoryError (CUDA; named, so torch is not imported here), MemoryError, or the CPU
    allocator's RuntimeError."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    return isinstance(exc, RuntimeError) and ("out of memory" in str(exc).lower() or "can't allocate memory" in str(exc))
