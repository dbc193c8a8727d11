"""How long the built-in model's first build takes on this machine: the README's "first run" figure.

Builds ``builtin-arith`` (its warm start, grpo_engine.model.model.WARMUP) in a fresh temporary cache, as a run's first
launch does, ``--repeats`` times, and prints each build's seconds with the CPU and torch's thread count. Run it on a
quiet machine: the build uses every core torch is given.

    .venv/bin/python -m bench.builtin_build
    .venv/bin/python -m bench.builtin_build --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench.harness import cpu_name


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()

    import torch

    from grpo_engine.model.model import WARMUP, builtin_model_dir

    print(f"{cpu_name()}, torch {torch.__version__} with {torch.get_num_threads()} threads; warm start {WARMUP}")
    seconds = []
    for i in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="grpo-build-") as cache:
            t = time.perf_counter()
            builtin_model_dir(Path(cache), log=lambda message: None)
            seconds.append(time.perf_counter() - t)
        print(f"build {i + 1}: {seconds[-1]:.1f} s")
    print(f"median {statistics.median(seconds):.1f} s over {len(seconds)} build(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
