"""The model cache: model directories built once, on first use, safe across processes.

A cached model (the built-in policy, a .gguf file converted to a model directory) is built in a temporary
directory beside its place and renamed into it, under a file lock: workers that need it at the same time wait for
the first one's build instead of building it again, and a build that was interrupted leaves no directory that
looks complete. A build leaves the process's random state as it found it, so that a run that built its model samples
exactly as one that found it cached. Also ``DTYPE_KEYWORD``, ``from_pretrained``'s dtype keyword in the installed transformers, which
both the builds and every load use to get fp32 weights.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import torch
import transformers
from packaging.version import Version

# from_pretrained's keyword for the weights' dtype: "dtype" from transformers 4.56 on, where "torch_dtype" still
# works but logs a deprecation warning at every load; before 4.56 "dtype" is not read (the checkpoint's dtype stays)
DTYPE_KEYWORD = "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"
DONE = "model.safetensors"  # the file whose presence says a cached model directory is complete


@contextmanager
def file_lock(path: Path):
    """Hold an exclusive lock on the file ``path`` (created with its directory) for the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def build_once(target: Path, lock: Path, build: Callable[[Path], None], missing: str) -> bool:
    """Make the model directory ``target`` exist, complete: where it holds no ``model.safetensors`` yet,
    ``build(tmp)`` writes it into a fresh temporary directory, which is then renamed to ``target``, all under the
    file lock ``lock``. A process that finds another's build done once it holds the lock builds nothing.

    ``build`` runs under a fork of torch's CPU random state (builds train and convert on the CPU): whatever it draws,
    the caller's random stream continues as if no build had happened.

    Returns whether this call built it. Raises RuntimeError with ``missing`` where ``build`` returned without
    writing the weights (transformers saves on rank 0 only in a distributed launch).
    """
    if (target / DONE).exists():
        return False
    with file_lock(lock):
        if (target / DONE).exists():  # another process built it meanwhile
            return False
        tmp = target.with_name(target.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            with torch.random.fork_rng(devices=[]):
                build(tmp)
            if not (tmp / DONE).exists():
                raise RuntimeError(missing)
            shutil.rmtree(target, ignore_errors=True)  # an incomplete directory from an interrupted build
            tmp.rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return True
