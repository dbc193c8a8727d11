"""The policy's learning rate at each step: a linear warm-up, then constant (the paper), linear or cosine decay.

Derived from the step number alone, so a resumed run and LoRA's new optimizer at each iteration get it without
anything saved: ``trainer.TrainingRun.next_step`` sets it on the optimizer before every step's update.
"""

from __future__ import annotations

import math


def learning_rate_at(step: int, total_steps: int, base_lr: float, warmup: int, schedule: str) -> float:
    """The learning rate of step ``step`` (0-based: the run's step 1 is 0) of ``total_steps`` (run-spec keys
    learning_rate, lr_warmup_steps, lr_schedule).

        warm-up, step < warmup:  lr = base_lr * (step + 1) / warmup          (reaches base_lr at its last step)
        after it, with progress p = (step - warmup) / max(1, total_steps - warmup), from 0 at the first step after
        the warm-up to just under 1 at the last:
            constant:  lr = base_lr
            linear:    lr = base_lr * (1 - p)
            cosine:    lr = base_lr * 0.5 * (1 + cos(pi * p))

    No step trains at 0. Example, base 1.0, 10 steps, warm-up 2: steps 0, 1 -> 0.5, 1.0; step 6 (p = 4/8 = 0.5)
    -> constant 1.0, linear 0.5, cosine 0.5; step 9 (p = 7/8) -> linear 0.125, cosine 0.0381.

    >>> [round(learning_rate_at(s, 10, 1.0, 2, "cosine"), 4) for s in (0, 1, 2, 6, 9)]
    [0.5, 1.0, 1.0, 0.5, 0.0381]
    """
    if step < warmup:
        return base_lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total_steps - warmup)
    if schedule == "linear":
        return base_lr * (1.0 - progress)
    if schedule == "cosine":
        return base_lr * 0.5 * (1.0 + math.cos(math.pi * progress))
    return base_lr


def set_learning_rate(optimizer, lr: float) -> None:
    """Every parameter group of ``optimizer`` takes ``lr`` from its next step on."""
    for group in optimizer.param_groups:
        group["lr"] = lr
