"""The processes of a data-parallel run, as the training loop sees them.

A run with ``devices`` > 1 is launched as that many processes (``accelerate launch``); Accelerate
wraps the policy for data parallelism, so each backward pass averages the gradients of all
processes. What else the loop shares goes through :class:`Processes`:

* every process draws the same B questions (the loop's ``random.Random`` is seeded alike) and keeps
  its own contiguous share of B / n of them: a group is always sampled, scored and normalised whole
  on one process;
* decisions (stop or not) and the main process's results (the reward model's training) are sent to
  all;
* per-output values and groups are gathered, in rank order, so metrics and recorded groups are
  those of the whole batch; sums (loss terms, token counts, correct answers) are added up.

With one process every method returns its input: no collective is ever called.
"""

from __future__ import annotations

import resource
from pathlib import Path
from typing import Any

import torch


class Processes:
    """This process's place in the run: ``rank`` of ``n`` (0 is the main process, which records)."""

    def __init__(self, accelerator):
        self.n = accelerator.num_processes
        self.rank = accelerator.process_index
        self.main = accelerator.is_main_process

    def share(self, items: list) -> list:
        """This process's contiguous share of ``items`` (their number is a multiple of n)."""
        k = len(items) // self.n
        return items[self.rank * k : (self.rank + 1) * k]

    def from_main(self, value: Any) -> Any:
        """The main process's ``value`` (any picklable object), on every process."""
        if self.n == 1:
            return value
        box = [value]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, items: list) -> list:
        """Every process's ``items`` (picklable), concatenated in rank order, on every process."""
        if self.n == 1:
            return items
        parts: list[list | None] = [None] * self.n
        torch.distributed.all_gather_object(parts, items)
        return [x for part in parts for x in part]

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sums of ``values`` over the processes (float64)."""
        if self.n == 1:
            return values
        t = torch.tensor(values, dtype=torch.float64)
        if torch.distributed.get_backend() == "nccl":
            t = t.cuda()
        torch.distributed.all_reduce(t)
        return t.cpu().tolist()

    def broadcast_module(self, module: torch.nn.Module) -> None:
        """Copy the main process's parameters and buffers of ``module`` into every process's copy."""
        if self.n == 1:
            return
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                torch.distributed.broadcast(t.data, src=0)

    def barrier(self) -> None:
        if self.n > 1:
            torch.distributed.barrier()


def reset_peak_memory(device: torch.device) -> None:
    """Measure this process's peak memory afresh from here (peak_memory): loading's transient copies left out. On the
    CPU, Linux's clear_refs resets the peak resident set (VmHWM); elsewhere nothing is reset."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def peak_memory(device: torch.device) -> int:
    """This process's peak memory since reset_peak_memory, in bytes: on a GPU what torch allocated on it, on the CPU
    the peak resident set (Linux's VmHWM; where it cannot be read, ru_maxrss: the process's whole life)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    try:
        status = Path("/proc/self/status").read_text()
        return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))) * 1024
    except (OSError, StopIteration, ValueError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
