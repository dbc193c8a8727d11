"""Runs with ``devices`` > 1: the worker launches the run's processes through Accelerate and watches them.

The worker that claimed the run keeps its lease (its LeaseKeeper thread) and starts

    python -m accelerate.commands.launch --multi_gpu --num_processes <devices> ... -m workers.distributed <run id> ...

in a session of its own (a Ctrl-C in the worker's terminal reaches the worker only). Each process runs
``grpo_engine.train.trainer.train``, data-parallel (see grpo_engine/train/parallel.py); on a worker without a GPU,
or for a run with ``device: cpu``, the processes run on the CPU and talk over gloo. The main process
(rank 0) records (steps, logs, phases) through a DBRecorder under the worker's name, so the lease fences
its writes exactly as for a single-process run; the other processes record nothing.

The worker and the processes talk through a control directory:

    stop           written by the worker: "pause" (the worker is shutting down), "lost" (another worker
                   took the run over) or "cancel" (the CLI's Ctrl-C); the main process reads it at the next
                   step boundary and every process stops there (after a checkpoint, for "pause")
    result.json    written by the main process when training returns: status, step, stop reason
    error-<r>.json written by process r when training raised: the one-line error and the traceback
    launch.log     everything the processes printed

The main process also stops (as "lost") when the worker that launched it is gone, so a killed worker
leaves no process behind that keeps its lease alive; the step in flight then ends without writing a checkpoint
(grpo_engine.train.trainer.TrainingRun.owns_run), as the worker that takes the run over may be resuming from them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from app import store
from app.core.admission import model_to_load
from app.core.settings import get_settings
from app.store.db import session_scope
from grpo_engine.report.recorder import Recorder, TrainResult, TrainStatus
from grpo_engine.spec.config import RunSpec, validate_spec
from workers.errors import one_line
from workers.recorder import DBRecorder, with_trackers

POLL_SECONDS = 0.5  # how often the worker looks at its shutdown flag, its lease and the processes
LOG_TAIL_LINES = 40  # lines of launch.log kept in the run's log when the processes fail without a message


class MainProcessRecorder(DBRecorder):
    """The main process's recorder: a DBRecorder that also stops when the worker says so (the stop file)
    or is gone (``parent_pid`` no longer runs)."""

    def __init__(self, run_id: int, worker: str, stop_file: Path, parent_pid: int):
        super().__init__(run_id, worker=worker, background=True)
        self.stop_file, self.parent_pid = stop_file, parent_pid

    def should_stop(self) -> bool | str:
        """As DBRecorder's, except that a lost lease found by a background write is a stop reason (all the
        processes then stop at this step boundary together) rather than an exception in this one."""
        if self.stop_reason is None:
            if self.stop_file.exists():
                self.stop_reason = self.stop_file.read_text().strip() or "pause"
            elif not _alive(self.parent_pid):
                self.stop_reason = "lost"
        try:
            return super().should_stop()
        except store.LeaseLost:
            self.stop_reason = "lost"
            return self.stop_reason


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def on_cpu(spec: RunSpec) -> bool:
    """Whether the run's processes train on the CPU: device 'cpu', or a worker without a CUDA GPU.
    A GPU run needs one GPU per process (ValueError naming ``devices`` otherwise)."""
    import torch

    from grpo_engine.train.placement import (
        run_device,
    )  # the single-process rule: cpu, gpu (refused without one) or auto

    if run_device(spec.device) == "cpu" or not torch.cuda.is_available():
        return True
    if torch.cuda.device_count() < spec.devices:
        raise ValueError(
            f"devices: the run asks for {spec.devices} GPUs but this worker has {torch.cuda.device_count()}"
        )
    return False


def launch_command(run_id: int, spec: RunSpec, worker: str, control_dir: Path, cpu: bool) -> list[str]:
    """The ``accelerate launch`` command line that starts the run's ``spec.devices`` processes."""
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        str(spec.devices),
        "--num_machines",
        "1",
        "--main_process_port",
        str(free_port()),
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "-m",
        "workers.distributed",
        str(run_id),
        "--worker",
        worker,
        "--control-dir",
        str(control_dir),
        "--parent-pid",
        str(os.getpid()),
        *(["--cpu"] if cpu else []),
    ]


def run_processes(run_id: int, spec: RunSpec, worker: str, recorder: DBRecorder) -> TrainResult:
    """Launch the run's processes, relay the worker's stop signals to them, and return what the main
    process reported (status completed / cancelled / paused / stopped, its step and stop reason), or a failed
    result with the error and the log when they failed.

    ``recorder``: the worker's recorder for the run; its ``should_stop()`` (lease lost, worker shutting
    down, cancelled) is relayed to the processes, and when it has a ``show(step, total, metrics)``
    method (the CLI's progress bar) it is called for each step the main process records, and its
    ``show_phase(name, done, total)`` for each phase (the main process records them; this process
    only reads them back)."""
    cpu = on_cpu(spec)
    control = Path(tempfile.mkdtemp(prefix=f"grpo-run-{run_id}-"))
    env = dict(os.environ)
    if cpu and "OMP_NUM_THREADS" not in env:  # the launcher would set 1: share the cores out instead
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // spec.devices))
    stop_file = control / "stop"
    with open(control / "launch.log", "wb") as log:
        proc = subprocess.Popen(
            launch_command(run_id, spec, worker, control, cpu),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        show, shown = getattr(recorder, "show", None), 0
        show_phase, shown_phase = getattr(recorder, "show_phase", None), None
        try:
            while proc.poll() is None:
                reason = recorder.should_stop()
                if reason and not stop_file.exists():
                    stop_file.write_text(reason)
                if show is not None:
                    with session_scope() as s:
                        for m in store.get_metrics(s, run_id):
                            if m["step"] > shown:
                                shown = m["step"]
                                show(shown, spec.total_steps, m)
                        run = store.get_run(s, run_id)
                    phase = (run["phase"], run["phase_done"], run["phase_total"])
                    if show_phase is not None and phase[0] is not None and phase != shown_phase:
                        shown_phase = phase
                        show_phase(*phase)
                time.sleep(POLL_SECONDS)
        except BaseException:  # the worker itself is being stopped hard: take the processes with it
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
            raise
    try:
        return _outcome(control, proc.returncode)
    finally:
        for f in control.iterdir():
            f.unlink()
        control.rmdir()


def _outcome(control: Path, returncode: int) -> TrainResult:
    result = control / "result.json"
    if result.exists():  # the main process finished (the others may have been stopped after it)
        return TrainResult.from_json(result.read_text())
    errors = sorted(control.glob("error-*.json"))
    log = (control / "launch.log").read_text(errors="replace")
    if errors:
        error = json.loads(errors[0].read_text())
        return TrainResult(TrainStatus.FAILED, error=error["error"], log=error["traceback"])
    tail = "\n".join(log.splitlines()[-LOG_TAIL_LINES:])
    return TrainResult(TrainStatus.FAILED, error=f"the run's processes exited with status {returncode}", log=tail)


def main(argv: list[str] | None = None) -> int:
    """One process of the run (started by ``accelerate launch``)."""
    parser = argparse.ArgumentParser(description="one process of a data-parallel GRPO run")
    parser.add_argument("run_id", type=int)
    parser.add_argument("--worker", required=True, help="the name under which the worker holds the run's lease")
    parser.add_argument("--control-dir", required=True, type=Path)
    parser.add_argument("--parent-pid", required=True, type=int)
    parser.add_argument("--cpu", action="store_true", help="train on the CPU (gloo) instead of one GPU per process")
    args = parser.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))

    from grpo_engine.train.trainer import train

    settings = get_settings()
    with session_scope() as s:
        config = store.get_run(s, args.run_id)["config"]
    recorder: Recorder = Recorder()  # the other processes record nothing
    if rank == 0:
        recorder = MainProcessRecorder(args.run_id, args.worker, args.control_dir / "stop", args.parent_pid)
    try:
        try:
            spec = model_to_load(validate_spec(config), settings)  # run:<id>: that run's trained policy
            mirror = with_trackers(recorder, args.run_id, spec) if rank == 0 else contextlib.nullcontext(recorder)
            with mirror as reporting:  # report_to: the main process mirrors what it records; closed however train ends
                result = train(
                    spec,
                    reporting,
                    settings.cache_dir,
                    device="cpu" if args.cpu else None,
                    checkpoint_dir=settings.run_dir(args.run_id),
                )
        finally:
            if isinstance(recorder, DBRecorder):
                recorder.close()
        outcome = TrainResult(result.status, result.step, stop_reason=getattr(recorder, "stop_reason", None))
    except store.LeaseLost:  # the main process left the loop alone: no process waits for the others
        (args.control_dir / "result.json").write_text(TrainResult(TrainStatus.STOPPED, stop_reason="lost").to_json())
        return 3  # non-zero: the launcher stops the other processes at once
    except Exception as exc:
        (args.control_dir / f"error-{rank}.json").write_text(
            json.dumps({"error": one_line(exc), "traceback": traceback.format_exc()})
        )
        traceback.print_exc()
        return 1  # the launcher stops the other processes
    if rank == 0:
        (args.control_dir / "result.json").write_text(outcome.to_json())
    _leave_process_group()
    return 0


def _leave_process_group() -> None:
    """Wait for every process, then close the process group (a process that exits while another still
    uses the group makes that one abort)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
