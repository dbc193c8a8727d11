"""Where a run runs: its device (``run_device``), its precision (``Precision``: where bf16 autocast applies, decided
per device by ``resolve_precision``; ``cpu_bf16_is_fast``) and the Accelerator that places its processes
(``make_accelerator``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class Precision:
    """Where a run's forward passes use bf16 autocast.

    ``accelerate``: Accelerate's ``mixed_precision`` ("bf16" or "no"); "bf16" autocasts every forward of the
    prepared policy, sampling included. ``scoring_bf16``: the log-prob passes and the update (pi_old, pi_ref,
    pi_theta, the learned reward model) run under bf16 autocast (``Learner.autocast``), and the frozen reference
    and reward-model prior are kept in bf16. On a CPU the sampler stays fp32 even then: token-by-token decoding
    re-casts every fp32 weight at each token under autocast, and measured slower in bf16 than in fp32.
    """

    accelerate: str
    scoring_bf16: bool

    def describe(self) -> str:
        if self.accelerate == "bf16":
            return "bf16 mixed precision"
        return "bf16 autocast for scoring and the update, fp32 sampling" if self.scoring_bf16 else "fp32"


def resolve_precision(precision: str, device_type: str, bf16_fast: bool) -> Precision:
    """The Precision of a run-spec ``precision`` on a device. ``bf16_fast``: on CUDA, the GPU supports bf16; on
    the CPU, it has bf16 matrix instructions (``cpu_bf16_is_fast``).

    fp32 -> no autocast. auto -> on CUDA, bf16 everywhere where supported; on the CPU, bf16 for scoring and
    the update where the CPU has bf16 instructions (AVX-512 BF16 or AMX: there a 2048x2048 bf16 matmul measured
    2.2x fp32's speed, and on SmolLM2-135M the log-prob passes 2.4x and the update 1.35x; without them bf16 is
    emulated, and the same matmul measured 3x slower than fp32), fp32 otherwise. bf16 -> bf16 whatever the CPU;
    a CUDA device without bf16 support refuses it (ValueError naming the key).
    """
    if precision == "fp32":
        return Precision("no", False)
    if precision not in ("auto", "bf16"):
        raise ValueError(f"precision: unknown value {precision!r}")
    if device_type == "cuda":
        if precision == "bf16" and not bf16_fast:
            raise ValueError("precision: this GPU does not support bf16; use 'fp32' or 'auto'")
        return Precision("bf16", True) if bf16_fast else Precision("no", False)
    return Precision("no", precision == "bf16" or bf16_fast)


def cpu_bf16_is_fast(cpuinfo: str | None = None) -> bool:
    """Whether this CPU multiplies bf16 matrices natively: its flags (Linux /proc/cpuinfo, or ``cpuinfo``'s
    text) list avx512_bf16 (AMD Zen 4 and later, Intel Cooper Lake) or amx_bf16 (Intel Sapphire Rapids and
    later). False where they cannot be read."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), [])
    return "avx512_bf16" in flags or "amx_bf16" in flags


def make_accelerator(device: str | None, precision: str):
    """The run's Accelerator and Precision: the Accelerator places the models (and, with bf16 on a GPU, runs
    the prepared policy's forwards under autocast).

    ``device``: None picks what Accelerate sees (a GPU when there is one), "cpu" forces the CPU.
    One worker process runs many jobs one after another, each with its own precision, so the
    process-wide Accelerate state left by an earlier job is cleared first (unless this process is
    part of a distributed launch).
    """
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState, PartialState

    cpu = device == "cpu" or (device is None and not torch.cuda.is_available())
    if device not in (None, "cpu") and not str(device).startswith("cuda"):
        raise ValueError(f"device must be None, 'cpu' or 'cuda', got {device!r}")
    if not (PartialState._shared_state and PartialState().use_distributed):
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
    plan = resolve_precision(
        precision, "cpu" if cpu else "cuda", cpu_bf16_is_fast() if cpu else torch.cuda.is_bf16_supported()
    )
    return Accelerator(cpu=cpu, mixed_precision=plan.accelerate), plan


def run_device(spec_device: str, device: str | None = None) -> str | None:
    """The device a run trains on: ``device`` when given (tests force "cpu"), else by the spec's
    ``device`` key: "cpu", "gpu" (refused on a machine without CUDA) or "auto" (None: a GPU if any)."""
    if device is not None:
        return device
    if spec_device == "cpu":
        return "cpu"
    if spec_device == "gpu" and not torch.cuda.is_available():
        raise ValueError("device: the run asks for 'gpu' but this worker has no CUDA GPU")
    return None
