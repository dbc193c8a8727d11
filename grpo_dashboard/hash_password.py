"""``grpo-dashboard hash-password [USER]``: read a password and print its hash (``USER:hash`` with a
user name), ready for GRPO_AUTH_USERS or GRPO_AUTH_FILE. Touches no store and no data directory."""

from __future__ import annotations

import argparse
import getpass
import sys

HELP = (
    "read a password (twice; one line from stdin when piped) and print its hash, for GRPO_AUTH_USERS or GRPO_AUTH_FILE"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("user", nargs="?", help="print `USER:hash`, ready to add (default: the hash alone)")


def _read_password() -> str:
    """Twice from the terminal (not echoed), or one line from stdin when it is not a terminal."""
    if not sys.stdin.isatty():
        return sys.stdin.readline().rstrip("\r\n")
    password = getpass.getpass("password: ")
    if getpass.getpass("again: ") != password:
        raise ValueError("the two passwords differ")
    return password


def run(args: argparse.Namespace) -> int:
    from app.core import auth

    if args.user is not None and not auth.USER_NAME.fullmatch(args.user):
        print("grpo-dashboard hash-password: a user name is 1 to 64 letters, digits or ._@+-", file=sys.stderr)
        return 2
    try:
        encoded = auth.hash_password(_read_password())
    except ValueError as e:
        print(f"grpo-dashboard hash-password: {e}", file=sys.stderr)
        return 2
    print(f"{args.user}:{encoded}" if args.user is not None else encoded)
    return 0
