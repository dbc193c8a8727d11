"""The ``grpo-dashboard`` command: its parser, and the dispatch to the module of each subcommand.

    grpo-dashboard [serve]   the dashboard; with the embedded broker it also starts one worker as a child process
    grpo-dashboard worker    a Celery worker alone (one per GPU machine in production)
    grpo-dashboard train SPEC.json       run one spec in the foreground, with a progress bar
    grpo-dashboard builtin-model DIR     write the built-in tiny model as a Hugging Face model directory
    grpo-dashboard hash-password [USER]  read a password, print its hash for GRPO_AUTH_USERS / GRPO_AUTH_FILE

Each subcommand is a module of this package (serve, worker, train, builtin_model, hash_password) with
its ``HELP`` line, ``add_arguments(parser)`` for its own flags and ``run(args) -> int``, the exit status.
Settings come from the environment (app/core/settings.py); ``--data-dir`` sets GRPO_DATA_DIR before they
are read, so the embedded worker inherits it. Nothing here or in those modules imports torch at import
time: the commands that need the engine import it when they run. URLs are printed with their passwords masked.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from grpo_dashboard import builtin_model, hash_password, serve, train, worker

# the subcommands, in the order --help lists them
COMMANDS = {
    "serve": serve,
    "worker": worker,
    "train": train,
    "builtin-model": builtin_model,
    "hash-password": hash_password,
}
WITHOUT_DATA_DIR = {"hash-password"}  # reads a password and prints its hash: no store, no files


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grpo-dashboard", description="Launch, watch and look inside GRPO runs.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--data-dir", help="where the embedded store, broker, caches and logs live (sets GRPO_DATA_DIR)"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module in COMMANDS.items():
        command = commands.add_parser(name, parents=[] if name in WITHOUT_DATA_DIR else [common], help=module.HELP)
        module.add_arguments(command)
        command.set_defaults(func=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not any(a in COMMANDS or a in ("-h", "--help") for a in argv):
        argv.insert(0, "serve")  # plain `grpo-dashboard [--port P ...]` serves
    args = build_parser().parse_args(argv)
    if getattr(args, "data_dir", None):  # hash-password has no --data-dir
        os.environ["GRPO_DATA_DIR"] = str(Path(args.data_dir).expanduser().resolve())
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
