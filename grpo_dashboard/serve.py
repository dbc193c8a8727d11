"""``grpo-dashboard serve``: the dashboard's web server; with the embedded broker it also starts two workers as
child processes, one that trains runs and one that answers tries (questions tried by hand: their own queue, so a
run training never holds one), and stops them on the way out (Ctrl-C or SIGTERM).

The web process never imports torch: the worker is a separate process (grpo_dashboard/worker.py).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from app.core.auth import mask_url
from app.core.settings import get_settings
from grpo_dashboard.worker import WORKER_STOP_SECONDS

HELP = "the dashboard (the default command)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=7860, help="port to listen on (default 7860)")


def _stop_on_sigterm(signum, frame):
    """SIGTERM ends `serve` the way Ctrl-C does, so the worker child is stopped on the way out."""
    raise KeyboardInterrupt


WEB_NICENESS = 10  # the web server's priority below its embedded worker's: watchers never starve training


def _start_worker(log_path: Path, *options: str) -> subprocess.Popen:
    """Start an embedded worker in its own session (Ctrl-C reaches only the server, which stops it)."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "grpo_dashboard.cli", "worker", "--embedded", *options],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")},
        )


def _stop_workers(workers: list[subprocess.Popen]) -> None:
    """Warm-shut the workers down together (a running job stops at its next step); kill any still running
    WORKER_STOP_SECONDS later."""
    for worker in workers:
        if worker.poll() is None:
            worker.terminate()
    deadline = time.monotonic() + WORKER_STOP_SECONDS
    for worker in workers:
        try:
            worker.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def run(args: argparse.Namespace) -> int:
    from app.core import auth
    from app.store import db
    from app.web import ui

    settings = get_settings()
    try:
        auth.load_users(settings)  # a malformed login entry stops us before the worker starts
    except auth.AuthConfigError as e:
        print(f"grpo-dashboard: {e}", file=sys.stderr)
        return 2
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    db.upgrade_database()
    workers: list[subprocess.Popen] = []
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        if settings.embedded_worker:
            from app.core.broker import declare_queues, tries_queue, worker_queues

            tries = tries_queue(settings.queue)
            declare_queues([*worker_queues(settings.queue, None), tries])  # before the workers and a launch race to
            for what, log_path, options in (
                ("embedded worker", settings.data_dir / "worker.log", ()),
                ("tries worker", settings.data_dir / "tries.log", ("--queue", tries)),
            ):
                workers.append(_start_worker(log_path, *options))
                print(f"grpo-dashboard: {what} (pid {workers[-1].pid}) logs to {log_path}", flush=True)
        else:
            print(
                f"grpo-dashboard: no embedded worker; runs go to queue {settings.queue!r} "
                f"on {mask_url(settings.broker_url)} (start workers with `grpo-dashboard worker`)",
                flush=True,
            )
        print(f"grpo-dashboard: data in {settings.data_dir}, store {mask_url(settings.database_url)}", flush=True)
        print(f"grpo-dashboard: open http://{args.host}:{args.port}", flush=True)
        if workers:  # the workers (started above, at normal priority) run first when they compete
            os.nice(WEB_NICENESS)
        ui.serve(args.host, args.port)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the server at once (the worker follows)
        if workers:
            print("grpo-dashboard: stopping the workers", flush=True)
            _stop_workers(workers)
    return 0
