"""``grpo-dashboard builtin-model DIR``: write the built-in tiny model as a Hugging Face model directory
(config, weights, tokenizer), so other tools can load it. The engine is imported only when this runs."""

from __future__ import annotations

import argparse
from pathlib import Path

from app.core.settings import get_settings

HELP = "write the built-in tiny model as a Hugging Face model directory"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", help="output directory")


def run(args: argparse.Namespace) -> int:
    from grpo_engine.model.model import write_builtin_model

    out = write_builtin_model(Path(args.dir), get_settings().cache_dir)
    print(f"wrote the built-in model to {out}:")
    for path in sorted(Path(out).iterdir()):
        print(f"  {path.name}")
    return 0
