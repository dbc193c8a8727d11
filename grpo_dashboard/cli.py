"""The ``grpo-dashboard`` command.

    grpo-dashboard [serve]   the dashboard; with the embedded broker it also starts one worker as a child process
    grpo-dashboard worker    a Celery worker alone (one per GPU machine in production)
    grpo-dashboard train SPEC.json       run one spec in the foreground, with a progress bar
    grpo-dashboard builtin-model DIR     write the built-in tiny model as a Hugging Face model directory
    grpo-dashboard hash-password [USER]  read a password, print its hash for GRPO_AUTH_USERS / GRPO_AUTH_FILE

Settings come from the environment (app/settings.py); ``--data-dir`` sets GRPO_DATA_DIR before they
are read, so the embedded worker inherits it. Nothing here imports torch at import time: the
commands that need the engine import it when they run. URLs are printed with their passwords masked.
"""
from __future__ import annotations

import argparse
import getpass
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from app.auth import mask_url
from app.settings import get_settings

WORKER_STOP_SECONDS = 30  # how long `serve` waits for its worker to stop before killing it
PROGRESS_METRICS = ("reward_mean", "kl", "loss", "eval/accuracy")  # shown next to `train`'s progress bar


# ---------------------------------------------------------------------------------------------
# serve


def _stop_on_sigterm(signum, frame):
    """SIGTERM ends `serve` the way Ctrl-C does, so the worker child is stopped on the way out."""
    raise KeyboardInterrupt


def _start_worker(log_path: Path) -> subprocess.Popen:
    """Start the embedded worker in its own session (Ctrl-C reaches only the server, which stops it)."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "grpo_dashboard.cli", "worker", "--embedded"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )


def _stop_worker(worker: subprocess.Popen) -> None:
    """Warm-shut the worker down (a running job stops at its next step), kill it if it takes too long."""
    if worker.poll() is not None:
        return
    worker.terminate()
    try:
        worker.wait(WORKER_STOP_SECONDS)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()


def cmd_serve(args: argparse.Namespace) -> int:
    from app import auth, db, ui

    settings = get_settings()
    try:
        auth.load_users(settings)  # a malformed login entry stops us before the worker starts
    except auth.AuthConfigError as e:
        print(f"grpo-dashboard: {e}", file=sys.stderr)
        return 2
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    db.upgrade_database()
    worker = None
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        if settings.embedded_worker:
            from app.broker import declare_queues, worker_queues

            declare_queues(worker_queues(settings.queue, None))  # before the worker and the first launch race to
            log_path = settings.data_dir / "worker.log"
            worker = _start_worker(log_path)
            print(f"grpo-dashboard: embedded worker (pid {worker.pid}) logs to {log_path}", flush=True)
        else:
            print(f"grpo-dashboard: no embedded worker; runs go to queue {settings.queue!r} "
                  f"on {mask_url(settings.broker_url)} (start workers with `grpo-dashboard worker`)", flush=True)
        print(f"grpo-dashboard: data in {settings.data_dir}, store {mask_url(settings.database_url)}", flush=True)
        print(f"grpo-dashboard: open http://{args.host}:{args.port}", flush=True)
        ui.serve(args.host, args.port)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the server at once (the worker follows)
        if worker is not None:
            print("grpo-dashboard: stopping the worker", flush=True)
            _stop_worker(worker)
    return 0


# ---------------------------------------------------------------------------------------------
# worker


def _exit_with_parent() -> None:
    """Embedded worker: once the dashboard that started us is gone (even SIGKILLed), shut down."""
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGTERM)  # Celery's warm shutdown; the running job stops at its next step
    time.sleep(WORKER_STOP_SECONDS)
    os._exit(1)


def _interrupt_running_job(**kwargs) -> None:
    """The worker is shutting down: the running job pauses at its next step and goes back to the queue."""
    from workers.recorder import interrupt

    interrupt.set()


def _requeue_orphaned_runs() -> None:
    """Embedded worker: runs still 'running' were left by an earlier embedded worker that was killed
    (it is the only worker of its store): back to the queue at once, to resume from their checkpoints."""
    from workers.runner import requeue_stale_runs

    requeued = requeue_stale_runs(lease_seconds=0)
    if requeued:
        print(f"grpo-dashboard worker: resuming runs left running: {requeued}", flush=True)


def _watch_leases(period: float, queues: list[str]) -> None:
    """Report this worker (its queues and GPUs) to the store now, then every ``period`` seconds report it
    again and requeue runs whose worker stopped renewing its lease (it died). Runs in its own thread:
    listing the GPUs imports torch, which the worker's start need not wait for."""
    import logging

    from workers.runner import local_gpus, report_worker, requeue_stale_runs

    logger = logging.getLogger("grpo.worker")
    try:
        gpus = local_gpus()
    except Exception:  # a broken CUDA install: this worker counts as one without a GPU
        logger.warning("could not list the GPUs", exc_info=True)
        gpus = []
    while True:
        try:
            report_worker(queues, gpus)
        except Exception:
            logger.warning("could not report this worker to the store", exc_info=True)
        time.sleep(period)
        try:
            requeue_stale_runs()
        except Exception:  # the store or broker hiccuped: try again next period
            logger.warning("could not check for stale runs", exc_info=True)


def _device_class() -> str:
    """'gpu' on a machine where torch sees a CUDA device, else 'cpu' (imports torch: worker only)."""
    import torch

    return "gpu" if torch.cuda.is_available() else "cpu"


def cmd_worker(args: argparse.Namespace) -> int:
    from celery.signals import worker_shutting_down

    from app import db
    from app.broker import celery_app, declare_queues, worker_queues

    settings = get_settings()
    db.upgrade_database()
    if args.queue:
        queues = args.queue
    else:  # its device class's queue and the one any worker takes; the embedded worker, the only one, takes all
        queues = ",".join(worker_queues(settings.queue, None if args.embedded else _device_class()))
    print(f"grpo-dashboard worker: queues {queues}; store {mask_url(settings.database_url)}; "
          f"broker {mask_url(settings.broker_url)}; checkpoints in {settings.checkpoint_dir}", flush=True)
    declare_queues(queues.split(","))
    if args.embedded:
        _requeue_orphaned_runs()
        threading.Thread(target=_exit_with_parent, name="exit-with-parent", daemon=True).start()
    worker_shutting_down.connect(_interrupt_running_job, weak=False)
    threading.Thread(target=_watch_leases, args=(settings.lease_seconds / 4, queues.split(",")), name="lease-watch",
                     daemon=True).start()
    celery_app.worker_main([
        "worker",
        "--pool=solo",  # the job runs in the worker's main process: one training job at a time, no fork of torch
        "--concurrency=1",
        "-Q", queues,
        f"--loglevel={args.loglevel}",
        f"--hostname=grpo-{os.getpid()}@%h",  # unique per process, so several workers on one machine coexist
        "--without-gossip", "--without-mingle",  # workers do not talk to each other
    ])
    return 0


# ---------------------------------------------------------------------------------------------
# train


def cmd_train(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from app import db, store
    from app.db import session_scope
    from grpo_engine.config import SpecError, validate_spec
    from workers.recorder import DBRecorder
    from workers.runner import execute_run

    try:
        raw = json.loads(Path(args.spec).read_text())
        spec = validate_spec(raw)
    except (OSError, json.JSONDecodeError) as exc:
        print(f"grpo-dashboard train: cannot read {args.spec}: {exc}", file=sys.stderr)
        return 2
    except SpecError as exc:
        print(f"grpo-dashboard train: bad run spec: {exc}", file=sys.stderr)
        return 2

    settings = get_settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    db.upgrade_database()
    name = spec.name or store.default_run_name(spec.model)
    with session_scope() as s:
        run_id = store.create_run(s, spec.to_dict(), name)
    print(f"run {run_id} ({name}) in {mask_url(settings.database_url)}", flush=True)

    ctrl_c = threading.Event()

    class ProgressRecorder(DBRecorder):
        """The DB recorder, plus a progress bar, the engine's log lines in the terminal, and Ctrl-C to cancel."""

        bar: tqdm | None = None

        def start(self, total_steps: int) -> None:
            super().start(total_steps)
            self.bar = tqdm(total=total_steps, unit="step", dynamic_ncols=True)

        def log(self, message: str) -> None:
            super().log(message)
            tqdm.write(message)

        def step(self, step: int, iteration: int, metrics: dict[str, float]) -> None:
            super().step(step, iteration, metrics)
            if self.bar is not None:
                self.show(step, self.bar.total, metrics)

        def show(self, step: int, total_steps: int, metrics: dict[str, float]) -> None:
            """Move the bar to ``step`` (also called for the steps a data-parallel run's processes record)."""
            if self.bar is None:
                self.bar = tqdm(total=total_steps, unit="step", dynamic_ncols=True)
            shown = {k: f"{v:.3g}" for k, v in metrics.items() if k in PROGRESS_METRICS}
            self.bar.set_postfix(shown, refresh=False)
            self.bar.update(step - self.bar.n)

        def should_stop(self) -> bool:
            if ctrl_c.is_set():
                self.stop_reason = "cancel"
            return super().should_stop()

    recorder = ProgressRecorder(run_id, background=True)

    def cancel_on_ctrl_c(signum, frame):
        """First Ctrl-C cancels the run at its next step; a second one stops at once."""
        signal.signal(signal.SIGINT, signal.default_int_handler)
        tqdm.write("cancelling at the next step (Ctrl-C again to stop now)")
        ctrl_c.set()

    signal.signal(signal.SIGINT, cancel_on_ctrl_c)
    try:
        status = execute_run(run_id, recorder)
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if recorder.bar is not None:
            recorder.bar.close()

    with session_scope() as s:
        run = store.get_run(s, run_id)
        metrics = store.get_metrics(s, run_id)
    print(f"run {run_id}: {status}" + (f" ({run['error']})" if run and run["error"] else ""))
    if metrics:
        print("final metrics: " + json.dumps(metrics[-1], indent=None, sort_keys=True))
    return 0 if status == "completed" else 1


# ---------------------------------------------------------------------------------------------
# builtin-model


def cmd_builtin_model(args: argparse.Namespace) -> int:
    from grpo_engine.model import write_builtin_model

    out = write_builtin_model(Path(args.dir), get_settings().cache_dir)
    print(f"wrote the built-in model to {out}:")
    for path in sorted(Path(out).iterdir()):
        print(f"  {path.name}")
    return 0


# ---------------------------------------------------------------------------------------------
# hash-password


def _read_password() -> str:
    """Twice from the terminal (not echoed), or one line from stdin when it is not a terminal."""
    if not sys.stdin.isatty():
        return sys.stdin.readline().rstrip("\r\n")
    password = getpass.getpass("password: ")
    if getpass.getpass("again: ") != password:
        raise ValueError("the two passwords differ")
    return password


def cmd_hash_password(args: argparse.Namespace) -> int:
    from app import auth

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


# ---------------------------------------------------------------------------------------------


COMMANDS = ("serve", "worker", "train", "builtin-model", "hash-password")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grpo-dashboard", description="Launch, watch and look inside GRPO runs.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data-dir", help="where the embedded store, broker, caches and logs live (sets GRPO_DATA_DIR)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    serve = commands.add_parser("serve", parents=[common], help="the dashboard (the default command)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=7860, help="port to listen on (default 7860)")
    serve.set_defaults(func=cmd_serve)

    worker = commands.add_parser("worker", parents=[common], help="a Celery worker that runs training jobs, one at a time")
    worker.add_argument("--queue", help="comma-separated queues to consume (default: GRPO_QUEUE (else 'grpo') and "
                                        "GRPO_QUEUE.gpu on a machine with a CUDA GPU, GRPO_QUEUE.cpu on one without)")
    worker.add_argument("--loglevel", default="INFO", help="Celery log level (default INFO)")
    worker.add_argument("--embedded", action="store_true",
                        help="started by `serve`: exit with the parent process, stop a running job on shutdown")
    worker.set_defaults(func=cmd_worker)

    train = commands.add_parser("train", parents=[common], help="run one run spec (JSON file) in the foreground")
    train.add_argument("spec", help="path to a JSON run spec")
    train.set_defaults(func=cmd_train)

    builtin = commands.add_parser("builtin-model", parents=[common],
                                  help="write the built-in tiny model as a Hugging Face model directory")
    builtin.add_argument("dir", help="output directory")
    builtin.set_defaults(func=cmd_builtin_model)

    hashing = commands.add_parser("hash-password",
                                  help="read a password (twice; one line from stdin when piped) and print its hash, "
                                       "for GRPO_AUTH_USERS or GRPO_AUTH_FILE")
    hashing.add_argument("user", nargs="?", help="print `USER:hash`, ready to add (default: the hash alone)")
    hashing.set_defaults(func=cmd_hash_password)
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
